#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <sluice/policy/schedule.hpp>
#include <sluice/testing/generator.hpp>

using namespace sluice;
using namespace sluice::policy;

namespace {
std::vector<tensor_info> deepseek_like(std::uint64_t bytes) {
  const auto p = testing::make_layout(testing::options_for_size(bytes));
  std::vector<tensor_info> v;
  for (const auto& t : p.tensors) v.push_back({t.name, t.size, t.shape});
  return v;
}

// The byte at `off` of tensor `index` (what storage holds: the oracle).
std::uint8_t file_byte(std::size_t index, std::uint64_t off) {
  return static_cast<std::uint8_t>(index * 131 + off * 7 + (off >> 8) + 1);
}

// What rank `r` must hold of entry `e`: its TP part (rows: one range;
// columns: its columns of every row, packed) or the whole tensor.
std::vector<std::uint8_t> expected_part(const load_plan& p, const plan_entry& e, rank_t r) {
  std::vector<std::uint8_t> v(p.kept_bytes(e));
  if (e.split == tp_split::columns) {
    const auto row = load_plan::row_bytes(e), part = row / p.tp, rows = e.info.size / row, k = p.tp_rank(r);
    for (std::uint64_t j = 0; j < rows; ++j)
      for (std::uint64_t b = 0; b < part; ++b) v[j * part + b] = file_byte(e.index, j * row + k * part + b);
  } else {
    const auto begin = p.kept_begin(e, r);
    for (std::uint64_t b = 0; b < v.size(); ++b) v[b] = file_byte(e.index, begin + b);
  }
  return v;
}

rank_set without(const rank_set& s, rank_t out) {
  rank_set t(s.world());
  for (auto r : s.members())
    if (r != out) t.insert(r);
  return t;
}

// One rank's memory of a window lane, and how often each kept byte was written.
struct rank_memory {
  std::vector<std::uint8_t> kept, scratch;
  std::vector<std::uint32_t> writes;  // per kept byte
  std::uint8_t* at(const region& g, std::uint64_t n) {
    auto& mem = g.kept ? kept : scratch;
    REQUIRE(g.off + n <= mem.size());
    return mem.data() + g.off;
  }
  void wrote(const region& g, std::uint64_t n) {
    if (!g.kept) return;
    for (std::uint64_t b = 0; b < n; ++b) ++writes[g.off + b];
  }
};

// Runs a whole schedule the way the window stages do (each rank reads its
// slices, cuts its column parts, then every message is copied from its
// sender to its receiver), and checks against the oracle that every rank
// holds exactly its part of every tensor it owns, each byte written once.
void require_schedule_delivers(const load_plan& p, const schedule& s) {
  REQUIRE(s.windows.size() == p.windows);
  std::vector<std::vector<std::uint32_t>> kept_in(p.entries.size(), std::vector<std::uint32_t>(p.world, 0));
  std::size_t next = 0;
  for (const auto& w : s.windows) {
    REQUIRE(w.begin == next);
    next = w.end;
    for (std::size_t i = w.begin; i < w.end; ++i) REQUIRE(p.entries[i].window == w.window);
    for (const auto& L : w.lanes) {
      INFO("window " << w.window << " lane " << static_cast<int>(L.lane));
      REQUIRE(L.ranks.size() == p.world);
      std::vector<rank_memory> mem(p.world);
      std::map<std::tuple<std::size_t, std::size_t, std::size_t>, std::uint64_t> landed;  // (node, entry, read) -> node window offset
      for (std::size_t r = 0; r < p.world; ++r) {
        const auto& lay = L.ranks[r];
        mem[r].kept.assign(lay.kept_bytes, 0);
        mem[r].scratch.assign(lay.scratch_bytes, 0);
        mem[r].writes.assign(lay.kept_bytes, 0);
        for (const auto& x : lay.reads) {
          const auto& e = p.entries[x.entry];
          const auto& rd = e.reads.at(x.read);
          if (s.node == node_copy::window && x.node != rank_layout::read_at::none) {
            // The bytes lie in the node window once: the reader's and every take's offsets agree.
            REQUIRE(x.node + rd.size <= s.node_window_bytes);
            const auto key = std::tuple{p.node_of(rd.reader), x.entry, x.read};
            const auto [it, fresh] = landed.emplace(key, x.node);
            REQUIRE(it->second == x.node);
          }
          if (x.taken) {  // a message within a node, which its receiver gets from the node
            REQUIRE(s.node != node_copy::none);
            if (s.node == node_copy::window) REQUIRE(x.node != rank_layout::read_at::none);
            REQUIRE(rd.reader != r);
            REQUIRE(p.node_of(rd.reader) == p.node_of(static_cast<rank_t>(r)));
            REQUIRE(e.owners.contains(static_cast<rank_t>(r)));
          } else {
            REQUIRE(rd.reader == r);
          }
          auto* dst = mem[r].at(x.at, rd.size);
          for (std::uint64_t b = 0; b < rd.size; ++b) dst[b] = file_byte(e.index, rd.offset + b);
          mem[r].wrote(x.at, rd.size);
        }
        for (const auto& c : lay.cuts) {
          const auto& x = lay.reads.at(c.from);
          const auto& e = p.entries[x.entry];
          const auto& rd = e.reads[x.read];
          REQUIRE(e.split == tp_split::columns);
          const auto row = load_plan::row_bytes(e), part = row / p.tp, rows = rd.size / row;
          const auto* src = mem[r].at(x.at, rd.size);
          auto* dst = mem[r].at(c.at, rows * part);
          for (std::uint64_t j = 0; j < rows; ++j) std::memcpy(dst + j * part, src + j * row + c.part * part, part);
          mem[r].wrote(c.at, rows * part);
        }
      }
      std::set<std::uint32_t> tags;
      std::vector<std::vector<std::uint8_t>> node_mem(p.nodes(), std::vector<std::uint8_t>(s.node_window_bytes, 0));
      std::vector<std::vector<bool>> relayed(p.nodes(), std::vector<bool>(s.node_window_bytes, false));  // bytes a relay received
      for (const auto& m : L.messages) {
        REQUIRE(tags.insert(m.tag).second);  // tags are unique in a window lane
        REQUIRE(m.from != m.to);
        if (s.node != node_copy::none) REQUIRE(p.node_of(m.from) != p.node_of(m.to));  // within a node: a take instead
        if (m.dst.node) {  // a relay: into its node's window, copied out below by the node's keepers
          REQUIRE(w.relayed);
          REQUIRE(m.dst.off + m.size <= s.node_window_bytes);
          for (std::uint64_t b = 0; b < m.size; ++b) {
            REQUIRE_FALSE(relayed[p.node_of(m.to)][m.dst.off + b]);  // one relay per place (merged messages cover several)
            relayed[p.node_of(m.to)][m.dst.off + b] = true;
          }
          std::memcpy(node_mem[p.node_of(m.to)].data() + m.dst.off, mem[m.from].at(m.src, m.size), m.size);
          continue;
        }
        REQUIRE(m.dst.kept);                 // a message lands in kept bytes
        std::memcpy(mem[m.to].at(m.dst, m.size), mem[m.from].at(m.src, m.size), m.size);
        mem[m.to].wrote(m.dst, m.size);
      }
      // The device lane's relays, second step: from a node's relay, which
      // received the bytes above, to the node's other keepers.
      std::set<std::uint32_t> tags2;
      for (const auto& m : L.second) {
        REQUIRE(L.lane == window_lane::device);
        REQUIRE(tags2.insert(m.tag).second);
        REQUIRE(m.from != m.to);
        REQUIRE(p.node_of(m.from) == p.node_of(m.to));  // within a node only
        REQUIRE(m.src.kept);
        REQUIRE(m.dst.kept);
        std::memcpy(mem[m.to].at(m.dst, m.size), mem[m.from].at(m.src, m.size), m.size);
        mem[m.to].wrote(m.dst, m.size);
      }
      for (std::size_t r = 0; r < p.world; ++r)
        for (const auto& c : L.ranks[r].copies) {
          REQUIRE(c.to.kept);
          const auto& got = relayed[p.node_of(static_cast<rank_t>(r))];
          REQUIRE(c.from + c.size <= got.size());
          for (std::uint64_t b = 0; b < c.size; ++b) REQUIRE(got[c.from + b]);  // a relay of its node received it
          std::memcpy(mem[r].at(c.to, c.size), node_mem[p.node_of(static_cast<rank_t>(r))].data() + c.from, c.size);
          mem[r].wrote(c.to, c.size);
        }
      // Node window ranges of one node and window never overlap.
      std::map<std::size_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> spans;
      for (const auto& [key, off] : landed) {
        const auto& e = p.entries[std::get<1>(key)];
        spans[std::get<0>(key)].emplace_back(off, off + e.reads[std::get<2>(key)].size);
      }
      for (auto& [node, v] : spans) {
        std::sort(v.begin(), v.end());
        for (std::size_t k = 1; k < v.size(); ++k) REQUIRE(v[k - 1].second <= v[k].first);
      }
      for (std::size_t r = 0; r < p.world; ++r) {
        const auto& lay = L.ranks[r];
        for (auto i : lay.sends) REQUIRE(L.messages.at(i).from == r);
        for (auto i : lay.recvs) REQUIRE(L.messages.at(i).to == r);
        for (auto i : lay.sends2) REQUIRE(L.second.at(i).from == r);
        for (auto i : lay.recvs2) REQUIRE(L.second.at(i).to == r);
        REQUIRE(std::is_sorted(lay.sends.begin(), lay.sends.end()));
        std::uint64_t parts = 0;
        for (const auto& k : lay.kept) {
          const auto& e = p.entries[k.entry];
          INFO("rank " << r << " tensor " << e.info.name);
          REQUIRE(travels_in(e, L.lane));
          REQUIRE(e.owners.contains(static_cast<rank_t>(r)));
          ++kept_in[k.entry][r];
          const auto want = expected_part(p, e, static_cast<rank_t>(r));
          REQUIRE(k.off + want.size() <= mem[r].kept.size());
          REQUIRE(std::equal(want.begin(), want.end(), mem[r].kept.begin() + static_cast<std::ptrdiff_t>(k.off)));
          parts += want.size();
        }
        REQUIRE(parts == lay.kept_bytes);  // the kept region is exactly the kept parts
        const auto& wr = mem[r].writes;
        REQUIRE(std::all_of(wr.begin(), wr.end(), [](std::uint32_t n) { return n == 1; }));  // every byte arrives once
      }
    }
  }
  REQUIRE(next == p.entries.size());
  // Every owner keeps every travelling tensor it owns in exactly one lane; shared tables travel in none.
  for (std::size_t i = 0; i < p.entries.size(); ++i)
    for (std::size_t r = 0; r < p.world; ++r)
      REQUIRE(kept_in[i][r] == (!p.entries[i].shared() && p.entries[i].owners.contains(static_cast<rank_t>(r)) ? 1u : 0u));
}
}  // namespace

TEST_CASE("a hand-checked window: layouts, tags and one coalesced message", "[policy][schedule]") {
  // DP2, three replicated tensors read whole (LPT: a -> rank 0; b, c -> rank 1).
  std::vector<tensor_info> t{{"a.weight", 64, {32}}, {"b.weight", 32, {16}}, {"c.weight", 16, {8}}};
  const auto p = make_plan(t, classifier::deepseek(), 1, 2, 1, offload_kind::none);
  REQUIRE(p.entry("a.weight").reads.front().reader == 0);
  REQUIRE(p.entry("b.weight").reads.front().reader == 1);
  REQUIRE(p.entry("c.weight").reads.front().reader == 1);
  const auto s = make_schedule(p);
  REQUIRE(s.windows.size() == 1);
  REQUIRE(s.windows[0].lanes.size() == 1);
  const auto& L = s.windows[0].lanes[0];
  REQUIRE(L.lane == window_lane::all);
  for (rank_t r = 0; r < 2; ++r) {
    const auto& lay = L.ranks[r];
    // Kept parts grouped by reader: a (rank 0's), then b and c (rank 1's), back to back.
    REQUIRE(lay.kept_bytes == 112);
    REQUIRE(lay.scratch_bytes == 0);
    REQUIRE(lay.kept.size() == 3);
    CHECK(lay.kept[0].entry == 0);
    CHECK(lay.kept[0].off == 0);
    CHECK(lay.kept[1].off == 64);
    CHECK(lay.kept[2].off == 96);
  }
  REQUIRE(L.ranks[0].reads.size() == 1);
  CHECK(L.ranks[0].reads[0].at == region{true, 0});
  REQUIRE(L.ranks[1].reads.size() == 2);
  CHECK(L.ranks[1].reads[0].at == region{true, 64});
  CHECK(L.ranks[1].reads[1].at == region{true, 96});
  // Three planned messages (tags 0, 1, 2); b and c lie back to back at both ends: one message of 48 bytes, tag 1.
  REQUIRE(p.messages.size() == 3);
  REQUIRE(L.messages.size() == 2);
  CHECK(L.messages[0].tag == 0);
  CHECK(L.messages[0].from == 0);
  CHECK(L.messages[0].to == 1);
  CHECK(L.messages[0].size == 64);
  CHECK(L.messages[0].src == region{true, 0});
  CHECK(L.messages[0].dst == region{true, 0});
  CHECK(L.messages[1].tag == 1);
  CHECK(L.messages[1].from == 1);
  CHECK(L.messages[1].to == 0);
  CHECK(L.messages[1].size == 48);
  CHECK(L.messages[1].src == region{true, 64});
  CHECK(L.messages[1].dst == region{true, 64});
  CHECK(L.ranks[0].sends == std::vector<std::size_t>{0});
  CHECK(L.ranks[0].recvs == std::vector<std::size_t>{1});
  CHECK(L.ranks[1].sends == std::vector<std::size_t>{1});
  CHECK(L.ranks[1].recvs == std::vector<std::size_t>{0});
  require_schedule_delivers(p, s);
}

TEST_CASE("a column split: the reader cuts its own part and packs one copy of each other part", "[policy][schedule]") {
  // TP2: o_proj 8 x 8 (2-byte elements: rows of 16 bytes), read whole by one rank.
  std::vector<tensor_info> t{{"model.layers.0.self_attn.o_proj.weight", 128, {8, 8}}};
  const auto p = make_plan(t, classifier::deepseek(), 2, 1, 1, offload_kind::none);
  const auto& e = p.entries[0];
  REQUIRE(e.split == tp_split::columns);
  REQUIRE(e.reads.size() == 1);
  const auto reader = e.reads[0].reader, other = 1 - reader;
  const auto s = make_schedule(p);
  const auto& L = s.windows[0].lanes[0];
  const auto& lay = L.ranks[reader];
  REQUIRE(lay.reads.size() == 1);
  CHECK(lay.reads[0].at == region{false, 0});  // whole rows: scratch
  CHECK(lay.kept_bytes == 64);                 // its 8 x 4 part
  REQUIRE(lay.cuts.size() == 2);
  CHECK(lay.cuts[0].part == p.tp_rank(reader));
  CHECK(lay.cuts[0].at == region{true, 0});
  CHECK(lay.cuts[1].part == p.tp_rank(other));
  CHECK(lay.cuts[1].at == region{false, 128});  // packed after the rows
  CHECK(lay.scratch_bytes == 128 + 64);
  REQUIRE(L.messages.size() == 1);
  CHECK(L.messages[0].src == region{false, 128});
  CHECK(L.messages[0].dst == region{true, 0});
  CHECK(L.messages[0].size == 64);
  CHECK(L.ranks[other].reads.empty());
  require_schedule_delivers(p, s);
}

TEST_CASE("every byte a rank keeps arrives exactly once, and is its part of the tensor", "[policy][schedule][property]") {
  const auto tensors = deepseek_like(1u << 20);
  std::size_t checked = 0;
  for (const char* topo : {"tp1,dp4,ep4", "tp2,dp2,ep4", "tp4,dp1,ep1", "tp2,dp2,ep1", "tp2,pp2", "dp2,ep2,pp2", "tp1,dp1,ep1"}) {
    for (auto off : {offload_kind::none, offload_kind::per_rank_host, offload_kind::shared_single, offload_kind::shared_cooperative}) {
      for (int variant = 0; variant < 2; ++variant) {
        plan_options o;
        o.uneven_tp_keep_whole = true;
        if (variant == 1) {  // many windows, slices and blocks of rows across readers, two nodes
          o.window_bytes = 64u << 10;
          o.split_bytes = 16u << 10;
          o.slice_alignment = 512;
          const auto world = parse_topology(topo).world_size();
          o.local_size = world >= 2 ? world / 2 : 1;
        }
        const auto p = make_plan(tensors, classifier::deepseek(), parse_topology(topo), off, o);
        for (auto lanes : {lane_split::one, lane_split::host_and_device})
          for (auto node : {node_copy::none, node_copy::page_cache, node_copy::window})
          for (bool relay : {false, true}) {
            INFO(topo << " " << offload_name(off) << " variant " << variant << " lanes " << static_cast<int>(lanes)
                      << " node copy " << static_cast<int>(node) << " relay " << relay);
            const auto s = make_schedule(p, lanes, node, relay);
            REQUIRE(s.windows.front().lanes.size() == (lanes == lane_split::one ? 1u : 2u));
            require_schedule_delivers(p, s);
            ++checked;
          }
      }
    }
  }
  REQUIRE(checked == 7 * 4 * 2 * 2 * 3 * 2);
}

TEST_CASE("the schedule's messages carry what the plan's counters say", "[policy][schedule]") {
  const auto tensors = deepseek_like(1u << 20);
  plan_options o;
  o.window_bytes = 64u << 10;
  const auto p = make_plan(tensors, classifier::deepseek(), 2, 2, 4, offload_kind::per_rank_host, o);
  const auto s = make_schedule(p);
  std::vector<std::uint64_t> sent(p.world, 0), received(p.world, 0);
  for (const auto& w : s.windows)
    for (const auto& L : w.lanes)
      for (const auto& m : L.messages) sent[m.from] += m.size, received[m.to] += m.size;
  CHECK(sent == p.sent_bytes);
  CHECK(received == p.received_bytes);
  REQUIRE(std::accumulate(sent.begin(), sent.end(), std::uint64_t{0}) > 0);
}

TEST_CASE("through the page cache, a node's messages become its receivers' takes and only other nodes' travel", "[policy][schedule]") {
  const auto tensors = deepseek_like(1u << 20);
  plan_options o;
  o.window_bytes = 64u << 10;
  o.local_size = 2;  // two nodes of two
  const auto p = make_plan(tensors, classifier::deepseek(), 2, 2, 4, offload_kind::per_rank_host, o);
  const auto s = make_schedule(p, lane_split::one, node_copy::page_cache);
  REQUIRE(s.digest != make_schedule(p, lane_split::one, node_copy::none).digest);  // ranks that disagree fail the plan check
  REQUIRE(s.digest != make_schedule(p, lane_split::one, node_copy::window).digest);
  REQUIRE(make_schedule(p, lane_split::one, node_copy::window).node_window_bytes > 0);
  REQUIRE(s.node_window_bytes == 0);
  // Each planned message is a take of its receiver (same node) or travels (other node), never both.
  std::uint64_t within = 0, across = 0, taken_messages = 0;
  for (const auto& m : p.messages) {
    const auto& e = *std::find_if(p.entries.begin(), p.entries.end(), [&](const plan_entry& x) {
      return &m >= p.messages.data() + x.first_message && &m < p.messages.data() + x.first_message + x.message_count;
    });
    (p.node_of(e.reads[m.read].reader) == p.node_of(m.to) ? within : across) += m.size;
  }
  std::vector<std::uint64_t> received(p.world, 0);
  std::uint64_t travelled = 0;
  for (const auto& w : s.windows)
    for (const auto& L : w.lanes) {
      for (const auto& m : L.messages) travelled += m.size, received[m.to] += m.size;
      for (const auto& r : L.ranks)
        for (const auto& x : r.reads) taken_messages += x.taken;
    }
  REQUIRE(within > 0);
  REQUIRE(across > 0);
  CHECK(travelled == across);
  REQUIRE(taken_messages > 0);
  // A rank whose every byte it keeps but does not read comes from its own node receives nothing.
  for (std::size_t r = 0; r < p.world; ++r) CHECK(received[r] <= p.received_bytes[r]);
  // With relays each byte crosses to a node once: less than the plan's own
  // messages across nodes carried (two keepers per node here).
  const auto rs = make_schedule(p, lane_split::one, node_copy::page_cache, true);
  std::uint64_t relayed = 0;
  for (const auto& w : rs.windows)
    for (const auto& L : w.lanes)
      for (const auto& m : L.messages) relayed += m.size;
  CHECK(relayed <= across);
  // Replicated weights kept by both ranks of the other node: half cross.
  const auto q = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::none, o);
  std::uint64_t plain = 0, once = 0;
  for (const auto& w : make_schedule(q, lane_split::one, node_copy::page_cache, false).windows)
    for (const auto& m : w.lanes[0].messages) plain += m.size;
  for (const auto& w : make_schedule(q, lane_split::one, node_copy::page_cache, true).windows)
    for (const auto& m : w.lanes[0].messages) once += m.size;
  REQUIRE(plain > 0);
  CHECK(once * 2 == plain);
}

// The failure protocol's pace (window_schedule::status): a window with a
// message exchanges status, one without only once status_every bytes of
// windows went by, and the last always does.
TEST_CASE("ranks exchange status after every window with a message, else every status_every bytes and after the last",
          "[policy][schedule]") {
  const auto tensors = deepseek_like(4u << 20);
  plan_options o;
  o.window_bytes = 64u << 10;
  o.local_size = 4;  // one node: through the page cache no window carries a message
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::none, o);
  REQUIRE(p.windows >= 8);
  auto bytes = [&](const window_schedule& w) {
    std::uint64_t n = 0;
    for (auto i = w.begin; i < w.end; ++i) n += p.entries[i].info.size;
    return n;
  };
  const std::uint64_t every = 256u << 10;
  const auto s = make_schedule(p, lane_split::one, node_copy::page_cache, false, every);
  std::uint64_t unchecked = 0;
  std::size_t exchanges = 0;
  for (const auto& w : s.windows) {
    INFO("window " << w.window);
    for (const auto& L : w.lanes) REQUIRE(L.messages.empty());
    unchecked += bytes(w);
    // No run of windows without one reaches `every` bytes; none is exchanged sooner.
    REQUIRE(w.status == (unchecked >= every || w.window + 1 == p.windows));
    if (w.status) unchecked = 0, ++exchanges;
  }
  REQUIRE(exchanges > 1);
  REQUIRE(exchanges < p.windows);
  REQUIRE(s.windows.back().status);
  // 0: every window; ranks that pass different paces fail the plan check.
  const auto all = make_schedule(p, lane_split::one, node_copy::page_cache, false, 0);
  for (const auto& w : all.windows) REQUIRE(w.status);
  REQUIRE(all.digest != s.digest);
  // Messages (one rank per node), the node window's copies: every window.
  o.local_size = 1;
  const auto q = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::none, o);
  for (const auto& w : make_schedule(q, lane_split::one, node_copy::none, false, every).windows) {
    bool travels = false;
    for (const auto& L : w.lanes) travels = travels || !L.messages.empty();
    if (travels) REQUIRE(w.status);
  }
  for (const auto& w : make_schedule(p, lane_split::one, node_copy::window, false, every).windows) REQUIRE(w.status);
}

TEST_CASE("a rank's kept parts that no message carries lie last, smallest first: what it writes itself is one prefix", "[policy][schedule]") {
  const auto tensors = deepseek_like(1u << 20);
  plan_options o;
  o.window_bytes = 256u << 10;
  o.local_size = 2;  // two nodes of two: some parts travel, the node's do not
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::per_rank_host, o);
  for (const auto node : {node_copy::none, node_copy::page_cache}) {
    const auto s = make_schedule(p, lane_split::one, node);
    require_schedule_delivers(p, s);
    std::size_t quiet_parts = 0, loud_parts = 0;
    for (const auto& w : s.windows)
      for (std::size_t r = 0; r < p.world; ++r) {
        const auto& L = w.lanes.at(0);
        const auto& lay = L.ranks[r];
        // Parts a message lands in, by their kept offset (every received
        // message lands in one part or back-to-back parts of one sender).
        std::set<std::uint64_t> loud;
        for (auto i : lay.recvs) {
          const auto& m = L.messages[i];
          for (const auto& k : lay.kept)
            if (k.off >= m.dst.off && k.off < m.dst.off + m.size) loud.insert(k.off);
        }
        for (auto i : lay.sends) {
          const auto& m = L.messages[i];
          if (!m.src.kept) continue;
          for (const auto& k : lay.kept)
            if (k.off >= m.src.off && k.off < m.src.off + m.size) loud.insert(k.off);
        }
        std::vector<std::pair<std::uint64_t, std::uint64_t>> by_off;  // (offset, bytes)
        for (const auto& k : lay.kept) by_off.emplace_back(k.off, p.kept_bytes(p.entries[k.entry]));
        std::sort(by_off.begin(), by_off.end());
        bool in_quiet = false;
        std::uint64_t last = 0;
        for (const auto& [off, n] : by_off) {
          if (loud.contains(off)) {
            REQUIRE_FALSE(in_quiet);  // no part a message carries after a quiet one
            ++loud_parts;
            continue;
          }
          if (in_quiet) REQUIRE(n >= last);  // quiet parts smallest first
          in_quiet = true, last = n, ++quiet_parts;
        }
      }
    REQUIRE(quiet_parts > 0);
    if (node == node_copy::none) REQUIRE(loud_parts > 0);
  }
}

TEST_CASE("the schedule's digest covers owners, split and destination, not just names and readers", "[policy][schedule]") {
  const auto tensors = deepseek_like(1u << 20);
  const auto p = make_plan(tensors, classifier::deepseek(), 2, 2, 4, offload_kind::shared_single);
  const auto d = make_schedule(p).digest;
  REQUIRE(make_schedule(make_plan(tensors, classifier::deepseek(), 2, 2, 4, offload_kind::shared_single)).digest == d);
  REQUIRE(make_schedule(p, lane_split::host_and_device).digest != d);
  // A shared table's owners never reach a window layout: only the digest of
  // the plan itself can tell two ranks apart that disagree on them.
  const auto table = static_cast<std::size_t>(
      std::find_if(p.entries.begin(), p.entries.end(), [](const plan_entry& e) { return e.shared(); }) - p.entries.begin());
  REQUIRE(table < p.entries.size());
  {
    auto q = p;
    q.entries[table].owners = without(q.entries[table].owners, 1);
    const auto s = make_schedule(q);
    CHECK(s.digest != d);
  }
  {  // one expert's owner
    auto q = p;
    auto& e = *std::find_if(q.entries.begin(), q.entries.end(), [](const plan_entry& x) { return x.info.cls == tensor_class::routed_expert; });
    const auto owner = e.owners.members().front();
    e.owners = without(e.owners, owner);
    e.owners.insert((owner + 1) % static_cast<rank_t>(q.world));
    CHECK(make_schedule(q).digest != d);
  }
  {
    auto q = p;
    auto& e = *std::find_if(q.entries.begin(), q.entries.end(), [](const plan_entry& x) { return x.split == tp_split::rows; });
    e.split = tp_split::none;
    CHECK(make_schedule(q).digest != d);
  }
  {
    auto q = p;
    q.entries[table].owner_destination = destination::host;
    CHECK(make_schedule(q).digest != d);
  }
}

TEST_CASE("with a device lane, relays carry each device byte to a node once, and the relay sends it on to its node's other keepers",
          "[policy][schedule]") {
  const auto tensors = deepseek_like(1u << 20);
  plan_options o;
  o.window_bytes = 64u << 10;
  o.local_size = 2;  // two nodes of two
  for (const auto split : {lane_split::one, lane_split::host_and_device}) {
    INFO((split == lane_split::one ? "one lane" : "host and device lanes"));
    // TP2 too (8 ranks, two nodes of four: each part kept twice per node):
    // row parts and column parts relayed per part.
    for (const std::size_t tp : {1, 2}) {
      INFO("tp" << tp);
      auto ot = o;
      ot.local_size = 2 * tp;
      const auto q = make_plan(tensors, classifier::deepseek(), tp, 4, 4 * tp, offload_kind::none, ot);
      const auto plain = make_schedule(q, split, node_copy::page_cache, false);
      const auto relayed = make_schedule(q, split, node_copy::page_cache, true);
      require_schedule_delivers(q, relayed);
      REQUIRE(plain.digest != relayed.digest);
      std::uint64_t across = 0, once = 0, second = 0;
      for (const auto& w : plain.windows)
        for (const auto& L : w.lanes)
          for (const auto& m : L.messages) across += m.size;
      for (const auto& w : relayed.windows)
        for (const auto& L : w.lanes) {
          for (const auto& m : L.messages) once += m.size;
          for (const auto& m : L.second) {
            second += m.size;
            REQUIRE(L.lane == window_lane::device);
          }
        }
      REQUIRE(across > 0);
      if (split == lane_split::host_and_device) REQUIRE(second > 0);
      // What no longer crosses is what the relays send on (device lane) or
      // their nodes' keepers copy from the node window (host lanes).
      CHECK(once < across);
      if (tp == 1) CHECK(once * 2 == across);  // everything crossing is kept by both ranks of the other node
    }
  }
}

TEST_CASE("with a device lane, host-destined tensors travel in the host lane, the rest in the device lane", "[policy][schedule]") {
  const auto tensors = deepseek_like(1u << 20);
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::per_rank_host);
  const auto s = make_schedule(p, lane_split::host_and_device);
  std::size_t host = 0, device = 0;
  for (const auto& w : s.windows) {
    REQUIRE(w.lanes.size() == 2);
    REQUIRE(w.lanes[0].lane == window_lane::host);
    REQUIRE(w.lanes[1].lane == window_lane::device);
    for (const auto& L : w.lanes)
      for (const auto& lay : L.ranks)
        for (const auto& k : lay.kept) {
          const bool to_host = p.entries[k.entry].owner_destination == destination::host;
          REQUIRE(to_host == (L.lane == window_lane::host));
          (to_host ? host : device) += 1;
        }
  }
  CHECK(host > 0);
  CHECK(device > 0);
}
