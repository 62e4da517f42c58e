#pragma once
/// \file
/// A window of a distributed load: which tensors it covers in each lane, where
/// one rank's bytes of it lie (`window_layout`), which point-to-point messages
/// carry each slice from its reader to the ranks that keep it
/// (`window_messages`), and the memory that holds them (`window_buffers`).
///
/// `layout_window(plan, rank, begin, end, lane)` is a pure function of the
/// plan and the lane, so a rank computes its peers' layouts too and both ends
/// of every message agree on where it lies (`window_messages` coalesces a
/// pair's back-to-back messages). The stages that fill, move and deliver a
/// window are read_window.hpp, exchange_window.hpp and deliver_window.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/lease.hpp>
#include <sluice/policy/plan.hpp>

namespace sluice::inline v0 {

/// Which tensors of a window a layout covers: every one that travels (no
/// device lane), those destined for host memory, or those for the device.
/// Shared tables are in none (they never travel).
enum class window_lane : std::uint8_t { all, host, device };

[[nodiscard]] inline bool travels_in(const policy::plan_entry& e, window_lane lane) noexcept {
  if (e.shared()) return false;
  switch (lane) {
    case window_lane::all: return true;
    case window_lane::host: return e.owner_destination != policy::destination::device;
    case window_lane::device: return e.owner_destination == policy::destination::device;
  }
  return false;
}

namespace detail {

// A window buffer reused while no sink holds a view into it (a sink that
// keeps views gets a fresh buffer next window): no first touch per window.
// Not pre-faulted: populating a window's buffers up front (MADV_POPULATE_WRITE)
// takes first touch out of the exchange but makes the whole load slower,
// because faults taken while a rank waits on its peers cost less than faults
// taken by every rank at once before reading (figures: bench/README.md).
class window_buffer {
 public:
  lease get(std::size_t n) {
    if (n == 0) return {};
    if (!mem_ || mem_.use_count() > 1 || cap_ < n) {
      const std::size_t cap = (std::max(n, cap_) + 4095) / 4096 * 4096;
      void* p = std::aligned_alloc(4096, cap);
      if (!p) throw std::bad_alloc();
      ::madvise(p, cap, MADV_HUGEPAGE);  // a hint
      mem_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
      cap_ = cap;
    }
    return lease(mem_, {static_cast<std::byte*>(mem_.get()), n});
  }

 private:
  std::shared_ptr<void> mem_;
  std::size_t cap_ = 0;
};

// Where one rank's bytes of a window go: a pure function of the plan, so that
// a rank can compute its peers' layouts too (to coalesce messages, both ends
// of a pair must agree). Two regions: `kept` (its parts of the tensors it
// owns; its own reads and the messages it receives land there) and `scratch`
// (what it reads only for others, and packed column parts it sends).
struct window_layout {
  static constexpr std::size_t none = ~std::size_t{0};
  struct region_at {
    bool kept = true;
    std::size_t off = 0;
  };
  struct read_at { std::size_t entry, read; region_at at; };
  struct cut_at { std::size_t from; std::uint32_t part; region_at at; };  // TP part `part` of reads[from]
  struct message_at { std::uint32_t tag; std::size_t peer; region_at at; std::size_t size; bool send; };
  std::vector<std::size_t> kept_off;  // by entry - begin; none: not kept
  std::vector<read_at> reads;         // this rank's reads, plan order
  std::vector<cut_at> cuts;           // column parts cut from its reads (its own part, or packed for others)
  std::vector<message_at> messages;   // its ends of the window's messages, in tag order
  std::size_t kept_bytes = 0, scratch_bytes = 0;
};

inline window_layout layout_window(const policy::load_plan& plan, policy::rank_t me, std::size_t begin, std::size_t end,
                                   window_lane lane = window_lane::all) {
  using region_at = window_layout::region_at;
  window_layout L;
  L.kept_off.assign(end - begin, window_layout::none);
  // Kept parts grouped by who sends them (the reader of a tensor read in one
  // piece, and the set of ranks that read goes to), plan order within a
  // group: then what one reader sends one receiver in a window lies back to
  // back at both ends and travels as one message.
  struct keyed { policy::rank_t reader; std::uint64_t receivers; std::size_t entry; };
  std::vector<keyed> order;
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (!travels_in(e, lane) || !e.owners.contains(me)) continue;
    keyed k{static_cast<policy::rank_t>(plan.world), 0, i};
    if (e.reads.size() == 1 && e.split != policy::tp_split::columns) {
      k.reader = e.reads[0].reader;
      plan.for_each_message(e, [&k](const policy::planned_message& m) { k.receivers = k.receivers * 1099511628211ull + m.to + 1; });
    }
    order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [](const keyed& x, const keyed& y) {
    return x.reader != y.reader ? x.reader < y.reader : x.receivers < y.receivers;
  });
  for (const auto& k : order) L.kept_off[k.entry - begin] = L.kept_bytes, L.kept_bytes += plan.kept_bytes(plan.entries[k.entry]);
  std::uint32_t tag = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (!travels_in(e, lane)) continue;
    const bool owned = e.owners.contains(me);
    const auto kept = L.kept_off[i - begin];
    const auto first = L.reads.size();
    for (std::size_t k = 0; k < e.reads.size(); ++k) {
      const auto& rd = e.reads[k];
      if (rd.reader != me) continue;
      if (plan.keeps_as_read(e, rd, me)) {
        L.reads.push_back({i, k, {true, kept + rd.offset - plan.kept_begin(e, me)}});
      } else {
        L.reads.push_back({i, k, {false, L.scratch_bytes}});
        L.scratch_bytes += rd.size;
      }
      if (e.split == policy::tp_split::columns && owned) {  // its own part of these rows
        const auto row = policy::load_plan::row_bytes(e);
        L.cuts.push_back({L.reads.size() - 1, static_cast<std::uint32_t>(plan.tp_rank(me)),
                          {true, kept + rd.offset / row * (row / plan.tp)}});
      }
    }
    plan.for_each_message(e, [&](const policy::planned_message& m) {
      const auto& rd = e.reads[m.read];
      if (rd.reader == me) {
        std::size_t from = first;  // this read among its reads
        while (L.reads[from].read != m.read) ++from;
        region_at src = L.reads[from].at;  // the bytes as read (no split, or a row split)
        if (e.split == policy::tp_split::columns) {
          if (owned && m.part == plan.tp_rank(me)) {
            src = {true, kept + m.at};  // its own part, cut from the rows
          } else {  // one packed copy of part m.part of these rows, for all its receivers
            auto& c = L.cuts;
            if (c.empty() || c.back().from != from || c.back().part != m.part) {
              c.push_back({from, m.part, {false, L.scratch_bytes}});
              L.scratch_bytes += m.size;
            }
            src = c.back().at;
          }
        }
        L.messages.push_back({tag, m.to, src, m.size, true});
      }
      if (m.to == me) L.messages.push_back({tag, rd.reader, {true, kept + m.at}, m.size, false});
      ++tag;
    });
  }
  return L;
}

// This rank's messages of the window, coalesced: consecutive messages of one
// pair (same direction) become one where they lie back to back at BOTH ends
// (the peer's layout is computed from the plan, so both ends decide alike).
// The merged message keeps the first one's tag.
inline std::vector<window_layout::message_at> window_messages(const policy::load_plan& plan, const window_layout& mine,
                                                              policy::rank_t me, std::size_t begin, std::size_t end,
                                                              window_lane lane = window_lane::all) {
  std::unordered_map<std::size_t, window_layout> peers;
  for (const auto& m : mine.messages)
    if (!peers.contains(m.peer)) peers.emplace(m.peer, layout_window(plan, static_cast<policy::rank_t>(m.peer), begin, end, lane));
  // The other end of each message: the peer's entry with the same tag.
  std::unordered_map<std::size_t, std::unordered_map<std::uint32_t, window_layout::region_at>> far;
  for (const auto& [peer, L] : peers)
    for (const auto& m : L.messages)
      if (m.peer == me) far[peer][m.tag] = m.at;
  std::vector<window_layout::message_at> out;
  std::unordered_map<std::size_t, std::size_t> last[2];  // by direction, peer: index in out
  std::unordered_map<std::size_t, window_layout::region_at> last_far[2];
  auto next_to = [](const window_layout::region_at& a, std::size_t n, const window_layout::region_at& b) {
    return a.kept == b.kept && a.off + n == b.off;
  };
  for (const auto& m : mine.messages) {
    const auto there = far.at(m.peer).at(m.tag);
    auto& l = last[m.send];
    auto& lf = last_far[m.send];
    if (auto it = l.find(m.peer); it != l.end()) {
      auto& prev = out[it->second];
      if (next_to(prev.at, prev.size, m.at) && next_to(lf.at(m.peer), prev.size, there)) {
        prev.size += m.size;
        continue;
      }
    }
    l[m.peer] = out.size();
    lf[m.peer] = there;
    out.push_back(m);
  }
  return out;
}

}  // namespace detail

/// A distributed load's window buffers (host memory), kept between loads:
/// give the same object to successive loads (`distributed_options::buffers`,
/// e.g. weight reloads) and they reuse memory already faulted in, instead of
/// paying first touch again (slow on hosts that reclaim freed pages, and paid
/// inside the exchange for bytes that arrive; see bench/README.md). One load
/// at a time; memory a sink still holds views into is replaced, not
/// overwritten.
class window_buffers {
 public:
  /// The buffer of window parity `parity` (0, 1) and region `region` (0: kept, 1: scratch).
  detail::window_buffer& at(unsigned parity, unsigned region) { return b_[parity % 2][region % 2]; }

 private:
  detail::window_buffer b_[2][2];
};

}  // namespace sluice::inline v0

namespace sluice::inline v0::detail {

// One lane of a window in flight: its layout, the memory its bytes occupy
// and the messages that move them.
struct lane_window {
  window_lane which = window_lane::all;
  lease kept, scratch;          // host memory: this rank's reads land here (and the host lane travels from/to it)
  lease dev_kept, dev_scratch;  // device lane: its memory (what travels, what the sink sees)
  window_layout layout;
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> uploads;  // (lane memory, host bytes)
  std::vector<comm::send_message> sends;
  std::vector<comm::recv_message> recvs;
  std::uint64_t sent = 0, received = 0, uploaded = 0;
  // A layout region as host memory (where reads land), and as the memory that travels and the sink sees.
  [[nodiscard]] std::span<std::byte> host_at(window_layout::region_at at, std::size_t n) const {
    return (at.kept ? kept : scratch).bytes().subspan(at.off, n);
  }
  [[nodiscard]] std::span<std::byte> data_at(window_layout::region_at at, std::size_t n) const {
    if (which != window_lane::device) return host_at(at, n);
    return (at.kept ? dev_kept : dev_scratch).bytes().subspan(at.off, n);
  }
};

// What one window cost and carried, counted by the stage that did the work;
// the driver adds them up into distributed_stats once the window is done.
struct window_stats {
  double read_seconds = 0, exchange_seconds = 0, deliver_seconds = 0;
  std::uint64_t fetched = 0;  // tensor bytes this rank read for it
  std::uint64_t sent = 0, received = 0, uploaded = 0, messages = 0;
  std::uint64_t tensors = 0, accepted = 0, owned = 0, placeholders = 0, shared_views = 0, device_views = 0;

  window_stats& operator+=(const window_stats& o) noexcept {
    read_seconds += o.read_seconds, exchange_seconds += o.exchange_seconds, deliver_seconds += o.deliver_seconds;
    fetched += o.fetched, sent += o.sent, received += o.received, uploaded += o.uploaded, messages += o.messages;
    tensors += o.tensors, accepted += o.accepted, owned += o.owned, placeholders += o.placeholders;
    shared_views += o.shared_views, device_views += o.device_views;
    return *this;
  }
};

// The window pipeline's input and output (read_window | exchange_window |
// deliver_window is a stage from window_ticket to window_ticket). In: the
// window to read, and this rank's failure so far that no status exchange has
// reported yet (a delivery that failed). Out: the window delivered, its
// stats, and the failure of its delivery, if any. A ticket is also the
// window's credit: the driver hands out the next one only when a window
// comes out, so at most `credits` windows (and their buffers) are in flight.
struct window_ticket {
  std::uint32_t window = 0;
  std::exception_ptr failure;
  window_stats stats;
};

// A window as it flows through read_window | exchange_window | deliver_window:
// plan entries [begin, end), one lane_window per lane (one without a device
// lane; host and device with one), where this rank's part of each entry it
// owns lies, and the window's own status and stats. `failure`: this rank's
// failure, as of this window (a read of it, or an earlier delivery), which
// the window's status exchange reports to every rank; a failed window
// carries no layout (its exchange ends the load).
struct window_state {
  std::uint32_t window = 0;
  std::size_t begin = 0, end = 0;
  std::vector<lane_window> lanes;
  std::vector<std::span<std::byte>> kept_at;  // by entry (i - begin): this rank's part of the tensor
  std::vector<std::uint8_t> lane_of;          // by entry: its lane (index into lanes)
  std::exception_ptr failure;
  window_stats stats;
};

}  // namespace sluice::inline v0::detail
