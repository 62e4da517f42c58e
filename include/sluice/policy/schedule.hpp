#pragma once
/// \file
/// The exchange schedule of a load plan: for every window and lane, every
/// rank's layout (where its kept parts, its reads and the column parts it
/// cuts lie in its window memory) and the lane's messages as they travel
/// (a pair's back-to-back messages coalesced into one), for all ranks at
/// once.
///
/// Pure: a function of the plan and of the lanes a load uses, computed once
/// (`make_schedule`) and digested whole (`schedule::digest`, which covers the
/// plan's names, sizes, owners, splits, destinations, reads, windows and
/// every layout and message: the ranks compare it before any read, so two
/// ranks that agree on it lay every window out alike). The window stages of
/// a distributed load (sluice/distributed/read_window.hpp) only read it. The
/// messages themselves are the plan's (load_plan::messages, enumerated once
/// by make_plan); the schedule gives each a tag, both ends' regions, and
/// merges them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sluice/policy/concepts.hpp>
#include <sluice/policy/plan.hpp>

namespace sluice::inline v0::policy {

/// Which tensors of a window a lane carries: every one that travels (a load
/// without a device lane), those destined for host memory, or those for the
/// device. Shared tables are in none (they never travel).
enum class window_lane : std::uint8_t { all, host, device };

/// Whether entry `e` travels in `lane`.
[[nodiscard]] inline bool travels_in(const plan_entry& e, window_lane lane) noexcept {
  if (e.shared()) return false;
  switch (lane) {
    case window_lane::all: return true;
    case window_lane::host: return e.owner_destination != destination::device;
    case window_lane::device: return e.owner_destination == destination::device;
  }
  return false;
}

/// How a planned message between two ranks of one node travels: over the
/// communicator like any other (`none`), or as a take of its receiver, which
/// gets the bytes from the node itself: from the page cache, reading the file
/// (`page_cache`: local files), or from the node window, a memory region
/// every local rank maps, which the reader reads into and every local rank
/// that keeps the bytes copies from after the window's status exchange
/// (`window`: S3, O_DIRECT, anything without a shared page cache).
enum class node_copy : std::uint8_t { none, page_cache, window };

/// The lanes of a load's windows: one (window_lane::all: everything travels
/// over the host communicator) or two (host, then device: a load with a
/// device lane).
enum class lane_split : std::uint8_t { one, host_and_device };

/// A place in one rank's memory of one window lane: its `kept` region (its
/// parts of the tensors it owns) or its scratch region (what it reads only
/// for others, and the column parts it packs for them), at byte `off`.
struct region {
  bool kept = true;
  std::uint64_t off = 0;
  /// The node window instead (of this window's parity, at `off`): where a
  /// relay receives what its node's ranks copy (rank_layout::copies).
  bool node = false;
  friend bool operator==(const region&, const region&) = default;
};

/// One message on the wire: `size` bytes from `from`'s `src` to `to`'s `dst`.
/// `tag` is the first planned message it carries (unique within its window
/// lane; both ends use it to match the message).
struct scheduled_message {
  std::uint32_t tag = 0;
  rank_t from = 0, to = 0;
  std::uint64_t size = 0;
  region src, dst;
};

/// One rank's layout of one window lane.
struct rank_layout {
  struct kept_part {
    std::size_t entry = 0;   ///< plan entry this rank owns
    std::uint64_t off = 0;   ///< where its part lies in the kept region
  };
  struct read_at {
    std::size_t entry = 0, read = 0;  ///< plan_entry::reads[read] of plan entry `entry`
    region at;                        ///< where the bytes land as read
    /// Not this rank's read from storage but a take: another rank of its node
    /// reads these bytes (the plan's reader), and this rank, which keeps
    /// them, gets them from its node instead of receiving them
    /// (schedule::node): from the page cache, reading the file, or copying
    /// them from the node window at `node`.
    bool taken = false;
    /// node_copy::window: where the bytes lie in the node window (of this
    /// window's parity); the reader reads them there, and it and every take
    /// copy them to `at` after the status exchange. `none`: not there.
    static constexpr std::uint64_t none = ~std::uint64_t{0};
    std::uint64_t node = none;
  };
  struct cut_at {
    std::size_t from = 0;     ///< index in `reads`: whole rows of a column-split tensor
    std::uint32_t part = 0;   ///< TP part cut out of them (packed)
    region at;
  };
  std::vector<kept_part> kept;        ///< plan order
  std::vector<read_at> reads;         ///< this rank's reads, plan order
  std::vector<cut_at> cuts;           ///< in the order they are cut
  /// Bytes from another node that one rank of this node (the relay)
  /// received into the node window, which this rank copies out after the
  /// exchange: `size` bytes at node window offset `from` to `to`.
  struct copy_at {
    std::size_t entry = 0;
    std::uint64_t from = 0, size = 0;
    region to;
  };
  std::vector<copy_at> copies;
  std::vector<std::size_t> sends;     ///< indexes into lane_schedule::messages, tag order
  std::vector<std::size_t> recvs;     ///< likewise
  std::vector<std::size_t> sends2;    ///< indexes into lane_schedule::second, tag order
  std::vector<std::size_t> recvs2;    ///< likewise
  std::uint64_t kept_bytes = 0, scratch_bytes = 0;
};

/// One lane of one window: every rank's layout and every message.
struct lane_schedule {
  window_lane lane = window_lane::all;
  std::vector<rank_layout> ranks;           ///< by rank
  std::vector<scheduled_message> messages;  ///< tag order
  /// The device lane's relays, second step (after `messages`): from the
  /// rank of a node that received bytes from another node (its relay, which
  /// keeps them) to the node's other keepers of them, device to device. Tag
  /// order; tags of their own.
  std::vector<scheduled_message> second;
};

/// One window: plan entries [begin, end) and its lanes (one, or host and device).
struct window_schedule {
  std::uint32_t window = 0;
  std::size_t begin = 0, end = 0;
  /// Whether some rank copies relayed bytes out of the node window after
  /// this window's exchange (rank_layout::copies): every rank then waits for
  /// every relay (a barrier) before it copies.
  bool relayed = false;
  /// Whether the ranks exchange their status (the failure protocol) once
  /// they have read this window, before its exchange. A window whose bytes
  /// all travel through the page cache or stay with their readers carries
  /// no message, and nothing of it waits for a peer; its failures are
  /// reported at the next window that exchanges status. Every window with a
  /// message (either lane, second steps included), a relay or the node
  /// window does (its copies wait on every reader), and so does the last,
  /// and at least every `status_every` bytes of windows (make_schedule): a
  /// rank's peers read no further than that past its failure. Through the
  /// page cache on one node, a load of 20 windows then waits on its 8 ranks
  /// 4 times instead of 20 (see bench/README.md).
  bool status = true;
  std::vector<lane_schedule> lanes;
};

/// make_schedule's default `status_every`: the bytes of windows without a
/// message of their own after which the ranks exchange their status anyway.
inline constexpr std::uint64_t default_status_every = std::uint64_t{2} << 30;

/// Every window of a plan, for every rank.
struct schedule {
  lane_split lanes = lane_split::one;
  /// How a planned message between two ranks of one node travels (see
  /// node_copy): the page cache (its bytes read through it: the kernel reads
  /// each byte from disk once for the node) or the node window carry it as
  /// its receiver's take (rank_layout::read_at::taken), so nothing of it
  /// crosses a socket; `none`: the communicator.
  node_copy node = node_copy::none;
  /// node_copy::window: bytes of the node window per parity (the most any
  /// node lands in one window).
  std::uint64_t node_window_bytes = 0;
  std::vector<window_schedule> windows;  ///< by window number
  std::uint64_t digest = 0;              ///< of the plan and of everything above
};

namespace detail {

struct schedule_hash {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, over 64-bit words
  void mix(std::uint64_t v) noexcept { h = (h ^ v) * 1099511628211ull; }
  void mix(std::string_view s) noexcept {
    mix(s.size());
    for (char ch : s) mix(static_cast<unsigned char>(ch));
  }
  void mix(const region& r) noexcept { mix(r.kept), mix(r.off), mix(r.node); }
};

// What the window's layouts depend on, from the plan: the world, the
// parallel sizes, the windows, and every entry's name, size, shape, owners,
// split, destination, stage, window, segment offset, reads and messages.
inline void hash_plan(schedule_hash& d, const load_plan& p) {
  for (auto v : {p.tp, p.dp, p.ep, p.pp, p.world, p.local_size}) d.mix(v);
  d.mix(static_cast<std::uint64_t>(p.offload)), d.mix(p.windows), d.mix(p.shared_bytes);
  for (auto b : p.segment_pieces) d.mix(b);
  for (const auto& e : p.entries) {
    d.mix(e.info.name), d.mix(e.info.size), d.mix(e.index);
    for (auto n : e.info.shape) d.mix(n);
    d.mix(e.owners.size());
    for (auto r : e.owners.members()) d.mix(r);
    d.mix(static_cast<std::uint64_t>(e.split)), d.mix(static_cast<std::uint64_t>(e.owner_destination));
    d.mix(e.parts), d.mix(e.groups), d.mix(e.group_dim);
    for (auto b : e.run_ends) d.mix(b);
    for (auto k : e.part_of) d.mix(k);
    d.mix(static_cast<std::uint64_t>(e.stage)), d.mix(e.window), d.mix(e.shared_offset);
    for (const auto& r : e.reads) d.mix(r.offset), d.mix(r.size), d.mix(r.reader);
    for (const auto& m : p.messages_of(e)) d.mix(m.read), d.mix(m.to), d.mix(m.size), d.mix(m.at), d.mix(m.part);
  }
}

inline void hash_window(schedule_hash& d, const window_schedule& w) {
  d.mix(w.window), d.mix(w.begin), d.mix(w.end), d.mix(w.relayed), d.mix(w.status);
  for (const auto& L : w.lanes) {
    d.mix(static_cast<std::uint64_t>(L.lane));
    for (const auto& r : L.ranks) {
      d.mix(r.kept_bytes), d.mix(r.scratch_bytes);
      for (const auto& k : r.kept) d.mix(k.entry), d.mix(k.off);
      for (const auto& x : r.reads) d.mix(x.entry), d.mix(x.read), d.mix(x.at), d.mix(x.taken), d.mix(x.node);
      for (const auto& c : r.cuts) d.mix(c.from), d.mix(c.part), d.mix(c.at);
      for (const auto& c : r.copies) d.mix(c.entry), d.mix(c.from), d.mix(c.size), d.mix(c.to);
      for (auto i : r.sends) d.mix(i);
      for (auto i : r.recvs) d.mix(i);
      for (auto i : r.sends2) d.mix(i);
      for (auto i : r.recvs2) d.mix(i);
    }
    for (const auto& m : L.messages) d.mix(m.tag), d.mix(m.from), d.mix(m.to), d.mix(m.size), d.mix(m.src), d.mix(m.dst);
    for (const auto& m : L.second) d.mix(m.tag), d.mix(m.from), d.mix(m.to), d.mix(m.size), d.mix(m.src), d.mix(m.dst);
  }
}

// A planned message of one window lane, tagged, with both ends' regions once
// the sender's and the receiver's layouts are made.
struct tagged_message {
  std::size_t entry = 0;
  const planned_message* m = nullptr;
  rank_t from = 0;
  region src, dst;
  std::uint64_t relay_to = rank_layout::read_at::none;  // a relay's message: lands in the node window here
  const planned_message* via = nullptr;  // a second step: the relay's own planned message (where it keeps the bytes)
};

// A relayed byte range one rank copies out of its node window (see copy_at),
// before its kept offset is known: entry, window offset, size, and where in
// its part of the tensor (planned_message::at).
struct pending_copy {
  std::size_t entry = 0;
  std::uint64_t from = 0, size = 0, at = 0;
};

// Rank `me`'s layout of entries [begin, end) in `lane`: fills `out` and its
// ends (src where it sends, dst where it receives) of the window lane's
// messages `msgs`; `mine` lists the tags of those it sends or receives, in
// tag order (so, entry by entry).
//
// Kept parts are grouped by who sends them (the reader of a tensor read in
// one piece, and the ranks that read goes to), plan order within a group:
// then what one reader sends one receiver in a window lies back to back at
// both ends and travels as one message.
//
// `takes`: the reads (entry, read) whose bytes this rank keeps and gets
// from its node itself (schedule::node), sorted; `landing`: under
// node_copy::window, where each read with takes lies in the node window.
using node_landing = std::map<std::pair<std::size_t, std::size_t>, std::uint64_t>;
inline void lay_out_rank(const load_plan& plan, rank_t me, std::size_t begin, std::size_t end, window_lane lane,
                         const std::vector<std::uint32_t>& mine, const std::vector<std::uint64_t>& receivers_key,
                         const std::vector<std::pair<std::size_t, std::size_t>>& takes, const node_landing& landing,
                         const std::vector<pending_copy>& copies, std::vector<tagged_message>& msgs,
                         const std::vector<std::uint32_t>& mine2, std::vector<tagged_message>& msgs2, rank_layout& out) {
  std::size_t next_copy = 0;  // in `copies` (entry order)
  std::size_t next2 = 0;      // in `mine2`
  auto takes_it = [&takes](std::size_t i, std::size_t k) { return std::binary_search(takes.begin(), takes.end(), std::pair{i, k}); };
  auto node_at = [&landing](std::size_t i, std::size_t k) {
    const auto it = landing.find({i, k});
    return it == landing.end() ? rank_layout::read_at::none : it->second;
  };
  constexpr auto none = ~std::uint64_t{0};
  std::vector<std::uint64_t> kept_off(end - begin, none);
  // Parts none of whose bytes travel to or from this rank (it reads or
  // takes them all) go last, smallest first: a large one may come as a view
  // of the page cache instead (read_window's map_above), and then the memory
  // this rank writes is one dense prefix of its kept region, not pages
  // scattered over all of it (each first touch of which the kernel zeroes,
  // a whole huge page at a time).
  std::vector<bool> quiet(end - begin, true);
  for (auto tag : mine) quiet[msgs[tag].entry - begin] = false;
  for (auto tag : mine2) quiet[msgs2[tag].entry - begin] = false;
  struct keyed { bool quiet; rank_t reader; std::uint64_t receivers; std::uint64_t size; std::size_t entry; };
  std::vector<keyed> order;
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (!travels_in(e, lane) || !e.owners.contains(me)) continue;
    keyed k{quiet[i - begin], static_cast<rank_t>(plan.world), 0, plan.kept_bytes(e), i};
    if (e.reads.size() == 1 && e.split != tp_split::columns) k.reader = e.reads[0].reader, k.receivers = receivers_key[i - begin];
    order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [](const keyed& x, const keyed& y) {
    if (x.quiet != y.quiet) return y.quiet;
    if (x.quiet) return x.size < y.size;
    return x.reader != y.reader ? x.reader < y.reader : x.receivers < y.receivers;
  });
  for (const auto& k : order) kept_off[k.entry - begin] = out.kept_bytes, out.kept_bytes += plan.kept_bytes(plan.entries[k.entry]);
  for (std::size_t i = begin; i < end; ++i)
    if (kept_off[i - begin] != none) out.kept.push_back({i, kept_off[i - begin]});
  std::size_t next = 0;  // in `mine`
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (!travels_in(e, lane)) continue;
    const bool owned = e.owners.contains(me);
    const bool reads = std::any_of(e.reads.begin(), e.reads.end(), [me](const planned_read& r) { return r.reader == me; });
    if (!owned && !reads) continue;  // none of its messages is this rank's
    const auto kept = kept_off[i - begin];
    const auto first = out.reads.size();
    for (std::size_t k = 0; k < e.reads.size(); ++k) {
      const auto& rd = e.reads[k];
      const bool taken = rd.reader != me && owned && takes_it(i, k);
      if (rd.reader != me && !taken) continue;
      // A take lands where the message would have: its bytes as read (whole,
      // or its row part), or whole runs cut below like its reader's.
      if (plan.keeps_as_read(e, rd, me)) {
        out.reads.push_back({i, k, {true, kept + rd.offset - plan.kept_begin(e, me)}, taken, node_at(i, k)});
      } else {
        out.reads.push_back({i, k, {false, out.scratch_bytes}, taken, node_at(i, k)});
        out.scratch_bytes += rd.size;
      }
      if (e.split == tp_split::columns && owned) {  // its own part of these rows
        out.cuts.push_back({out.reads.size() - 1, static_cast<std::uint32_t>(plan.part_of(e, me)),
                            {true, kept + rd.offset / plan.parts(e)}});   // whole runs: its blocks of them
      }
    }
    for (; next < mine.size() && msgs[mine[next]].entry == i; ++next) {
      auto& t = msgs[mine[next]];
      const auto& m = *t.m;
      const auto& rd = e.reads[m.read];
      if (rd.reader == me) {
        std::size_t from = first;  // this read among its reads
        while (out.reads[from].read != m.read) ++from;
        region src = out.reads[from].at;  // the bytes as read (no split, or a row split)
        if (e.split == tp_split::columns) {
          if (owned && m.part == plan.part_of(e, me)) {
            src = {true, kept + m.at};  // its own part, cut from the rows
          } else {  // one packed copy of part m.part of these rows, for all its receivers
            auto& c = out.cuts;
            if (c.empty() || c.back().from != from || c.back().part != m.part) {
              c.push_back({from, m.part, {false, out.scratch_bytes}});
              out.scratch_bytes += m.size;
            }
            src = c.back().at;
          }
        }
        t.src = src;
      }
      if (m.to == me) t.dst = t.relay_to == rank_layout::read_at::none ? region{true, kept + m.at} : region{false, t.relay_to, true};
    }
    for (; next2 < mine2.size() && msgs2[mine2[next2]].entry == i; ++next2) {  // second steps: kept to kept
      auto& t = msgs2[mine2[next2]];
      if (t.from == me) t.src = {true, kept + t.via->at};
      if (t.m->to == me) t.dst = {true, kept + t.m->at};
    }
    for (; next_copy < copies.size() && copies[next_copy].entry == i; ++next_copy) {
      const auto& c = copies[next_copy];
      out.copies.push_back({i, c.from, c.size, {true, kept + c.at}});
    }
  }
}

// Coalesces a window lane's tagged messages: consecutive messages of one
// pair (in tag order) become one where they lie back to back at both ends.
// The merged message keeps the first one's tag.
inline std::vector<scheduled_message> coalesce(const std::vector<tagged_message>& msgs, const load_plan& plan) {
  std::vector<scheduled_message> out;
  std::unordered_map<std::uint64_t, std::size_t> last;  // pair (from * world + to): index in out
  auto next_to = [](const region& a, std::uint64_t n, const region& b) {
    return a.kept == b.kept && a.node == b.node && a.off + n == b.off;
  };
  for (std::size_t tag = 0; tag < msgs.size(); ++tag) {
    const auto& t = msgs[tag];
    const auto pair = static_cast<std::uint64_t>(t.from) * plan.world + t.m->to;
    if (auto it = last.find(pair); it != last.end()) {
      auto& prev = out[it->second];
      if (next_to(prev.src, prev.size, t.src) && next_to(prev.dst, prev.size, t.dst)) {
        prev.size += t.m->size;
        continue;
      }
    }
    last[pair] = out.size();
    out.push_back({static_cast<std::uint32_t>(tag), t.from, t.m->to, t.m->size, t.src, t.dst});
  }
  return out;
}

}  // namespace detail

/// Lane `lane` of the window of plan entries [begin, end): every rank's
/// layout and the lane's messages (`node`: schedule::node, so that a message
/// between two ranks of one node is a take of its receiver instead;
/// `node_fill`, by node: bytes of the node window this window has landed so
/// far, in its lanes before this one).
/// `relay`: a message to another node goes, per (read, part) and node, to
/// one of its keepers there only (the relay), into its node window; the
/// node's other keepers copy it from there after the exchange, so each byte
/// crosses to a node once (host lanes; needs `node_fill`). In the device
/// lane the relay receives it into its own (device) memory, and sends it on
/// to the node's other keepers in a second step (lane_schedule::second).
[[nodiscard]] inline lane_schedule schedule_lane(const load_plan& plan, std::size_t begin, std::size_t end,
                                                 window_lane lane, node_copy node = node_copy::none,
                                                 std::vector<std::uint64_t>* node_fill = nullptr, bool relay = false) {
  lane_schedule L;
  L.lane = lane;
  // The window lane's messages, tagged in plan order (entry, then the
  // plan's message order), and each single-read entry's receivers (the key
  // that groups kept parts by who sends them).
  // Each rank's messages (those it sends or receives) by tag.
  std::vector<detail::tagged_message> msgs;
  std::vector<std::uint64_t> receivers_key(end - begin, 0);
  std::vector<std::vector<std::uint32_t>> by_rank(plan.world);
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> takes(plan.world);  // by receiver: (entry, read), sorted
  detail::node_landing landing;
  std::vector<std::vector<detail::pending_copy>> copies(plan.world);  // by rank, entry order
  std::map<std::tuple<std::size_t, std::size_t, std::uint32_t, std::size_t>, std::uint64_t> relayed;  // (entry, read, part, node) -> window offset
  relay = relay && node_fill;
  const bool two_steps = relay && lane == window_lane::device;
  std::vector<detail::tagged_message> msgs2;  // second steps
  std::vector<std::vector<std::uint32_t>> by_rank2(plan.world);
  std::map<std::tuple<std::size_t, std::size_t, std::uint32_t, std::size_t>, const planned_message*> first_of;  // device lane: the relay's message
  // A place in node `n`'s window for `size` bytes, cache-line aligned (no
  // two ranks' copies share a line).
  auto land = [node_fill](std::size_t n, std::uint64_t size) {
    auto& fill = node_fill->at(n);
    return std::exchange(fill, fill + (size + 63) / 64 * 64);
  };
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (!travels_in(e, lane)) continue;
    for (const auto& m : plan.messages_of(e)) {
      const auto& rd = e.reads[m.read];
      if (two_steps && plan.node_of(rd.reader) != plan.node_of(m.to)) {
        const auto key = std::tuple{i, m.read, m.part, plan.node_of(m.to)};
        const auto [it, first] = first_of.emplace(key, &m);
        if (!first) {  // the node's relay (the first keeper in message order) sends it on
          const auto tag = static_cast<std::uint32_t>(msgs2.size());
          msgs2.push_back({i, &m, it->second->to, {}, {}, rank_layout::read_at::none, it->second});
          by_rank2[msgs2.back().from].push_back(tag);
          by_rank2[m.to].push_back(tag);
          continue;
        }
        // The relay's own message: travels as any other (below).
      } else if (relay && plan.node_of(rd.reader) != plan.node_of(m.to)) {
        const auto to_node = plan.node_of(m.to);
        const auto key = std::tuple{i, m.read, m.part, to_node};
        auto it = relayed.find(key);
        const bool first = it == relayed.end();
        if (first) it = relayed.emplace(key, land(to_node, m.size)).first;
        copies[m.to].push_back({i, it->second, m.size, m.at});
        if (!first) continue;  // the relay's message carries it to this node
        const auto tag = static_cast<std::uint32_t>(msgs.size());
        msgs.push_back({i, &m, rd.reader, {}, {}, it->second});
        by_rank[msgs.back().from].push_back(tag);
        by_rank[m.to].push_back(tag);
        receivers_key[i - begin] = receivers_key[i - begin] * 1099511628211ull + m.to + 1;
        continue;
      }
      if (node != node_copy::none && plan.node_of(rd.reader) == plan.node_of(m.to)) {
        if (takes[m.to].empty() || takes[m.to].back() != std::pair{i, m.read}) takes[m.to].emplace_back(i, m.read);
        if (node == node_copy::window && !landing.contains({i, m.read}))
          landing.emplace(std::pair{i, m.read}, land(plan.node_of(rd.reader), rd.size));
        continue;
      }
      const auto tag = static_cast<std::uint32_t>(msgs.size());
      msgs.push_back({i, &m, e.reads[m.read].reader, {}, {}});
      by_rank[msgs.back().from].push_back(tag);
      by_rank[m.to].push_back(tag);
      receivers_key[i - begin] = receivers_key[i - begin] * 1099511628211ull + m.to + 1;
    }
  }
  L.ranks.resize(plan.world);
  for (std::size_t r = 0; r < plan.world; ++r)
    detail::lay_out_rank(plan, static_cast<rank_t>(r), begin, end, lane, by_rank[r], receivers_key, takes[r], landing,
                         copies[r], msgs, by_rank2[r], msgs2, L.ranks[r]);
  L.messages = detail::coalesce(msgs, plan);
  for (std::size_t k = 0; k < L.messages.size(); ++k) {
    L.ranks[L.messages[k].from].sends.push_back(k);
    L.ranks[L.messages[k].to].recvs.push_back(k);
  }
  L.second = detail::coalesce(msgs2, plan);
  for (std::size_t k = 0; k < L.second.size(); ++k) {
    L.ranks[L.second[k].from].sends2.push_back(k);
    L.ranks[L.second[k].to].recvs2.push_back(k);
  }
  return L;
}

/// The schedule of every window of `plan` for every rank, with the lanes of
/// `lanes`, messages within a node carried by it as `node` says
/// (schedule::node); digested whole. Pure: every rank computes the same one
/// from the same plan and arguments.
/// `relay`: messages to other nodes through one relay per node (schedule_lane).
/// `status_every`: the bytes of windows without a status exchange of their
/// own (window_schedule::status) after which one exchanges status anyway;
/// 0: every window does.
[[nodiscard]] inline schedule make_schedule(const load_plan& plan, lane_split lanes = lane_split::one,
                                            node_copy node = node_copy::none, bool relay = false,
                                            std::uint64_t status_every = default_status_every) {
  schedule s;
  s.lanes = lanes;
  s.node = node;
  detail::schedule_hash d;
  detail::hash_plan(d, plan);
  d.mix(static_cast<std::uint64_t>(lanes)), d.mix(static_cast<std::uint64_t>(node)), d.mix(relay);
  std::size_t begin = 0;
  std::uint64_t unchecked = 0;  // bytes of windows since the last status exchange
  for (std::uint32_t w = 0; w < plan.windows; ++w) {
    window_schedule ws;
    ws.window = w;
    ws.begin = begin;
    ws.end = begin;
    while (ws.end < plan.entries.size() && plan.entries[ws.end].window == w) ++ws.end;
    begin = ws.end;
    std::vector<std::uint64_t> fill(plan.nodes(), 0);  // node window bytes landed in this window, by node
    if (lanes == lane_split::one) {
      ws.lanes.push_back(schedule_lane(plan, ws.begin, ws.end, window_lane::all, node, &fill, relay));
    } else {
      ws.lanes.push_back(schedule_lane(plan, ws.begin, ws.end, window_lane::host, node, &fill, relay));
      ws.lanes.push_back(schedule_lane(plan, ws.begin, ws.end, window_lane::device, node, &fill, relay));
    }
    for (const auto& L : ws.lanes)
      for (const auto& r : L.ranks) ws.relayed = ws.relayed || !r.copies.empty();
    bool travels = ws.relayed || node == node_copy::window;  // the node window's copies wait for every reader
    for (const auto& L : ws.lanes) travels = travels || !L.messages.empty() || !L.second.empty();
    for (auto i = ws.begin; i < ws.end; ++i) unchecked += plan.entries[i].info.size;
    ws.status = status_every == 0 || travels || w + 1 == plan.windows || unchecked >= status_every;
    if (ws.status) unchecked = 0;
    for (auto f : fill) s.node_window_bytes = std::max(s.node_window_bytes, f);
    detail::hash_window(d, ws);
    s.windows.push_back(std::move(ws));
  }
  d.mix(s.node_window_bytes);
  s.digest = d.h;
  return s;
}

}  // namespace sluice::inline v0::policy
