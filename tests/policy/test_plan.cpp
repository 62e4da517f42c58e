#include <catch2/catch.hpp>

#include <algorithm>

#include <concepts>
#include <map>
#include <numeric>
#include <type_traits>

#include <sluice/policy/plan.hpp>
#include <sluice/policy/schedule.hpp>
#include <sluice/testing/generator.hpp>

using namespace sluice;
using namespace sluice::policy;

namespace {
// A DeepSeek-like tensor list, metadata only (the generator's plan; no bytes).
std::vector<tensor_info> deepseek_like(std::uint64_t bytes = std::uint64_t{2} << 30) {
  const auto p = testing::make_layout(testing::options_for_size(bytes));
  std::vector<tensor_info> v;
  for (const auto& t : p.tensors) v.push_back({t.name, t.size, t.shape});
  return v;
}

std::uint64_t total(const std::vector<tensor_info>& v) {
  return std::accumulate(v.begin(), v.end(), std::uint64_t{0}, [](auto a, const auto& t) { return a + t.size; });
}

// Reads tile every tensor exactly once (per node for shared tables).
void require_reads_tile(const load_plan& p) {
  for (const auto& e : p.entries) {
    const std::size_t copies = e.shared() ? p.nodes() : 1;
    std::uint64_t covered = 0, next = 0;
    for (const auto& r : e.reads) {
      if (next == e.info.size) next = 0;  // the next node's copy starts over
      REQUIRE(r.offset == next);
      next = r.offset + r.size;
      covered += r.size;
    }
    REQUIRE(covered == e.info.size * copies);
  }
}
}  // namespace

TEST_CASE("offload strategies model the offload_strategy concept", "[policy][plan]") {
  STATIC_REQUIRE(offload_strategy<offload::shared_host<offload::cooperative>>);
  STATIC_REQUIRE(offload::shared_host<offload::single_reader>::kind == offload_kind::shared_single);
}

TEST_CASE("TP1/DP8/EP8: busiest reader reads at most 1.05x the mean, every offload", "[policy][plan][reader_assignment]") {
  const auto tensors = deepseek_like();
  for (auto off : {offload_kind::none, offload_kind::per_rank_host, offload_kind::shared_cooperative}) {
    const auto p = make_plan(tensors, classifier::deepseek(), 1, 8, 8, off);
    INFO("offload " << offload_name(off) << " imbalance " << p.read_imbalance());
    REQUIRE(p.read_imbalance() <= 1.05);
    REQUIRE(std::accumulate(p.read_bytes.begin(), p.read_bytes.end(), std::uint64_t{0}) == total(tensors));
    require_reads_tile(p);
  }
}

TEST_CASE("the typed plan front end gives the same plan as the run-time one", "[policy][plan]") {
  const auto tensors = deepseek_like(64u << 20);
  const auto parses = run_time_parses();
  const auto a = plan<tp1_dp8_ep8, offload::shared_host<offload::cooperative>>::compute(tp1_dp8_ep8{}, tensors);
  REQUIRE(run_time_parses() == parses);  // the sizes and the strategy came from the types
  using typed = std::remove_cvref_t<decltype(a)>;
  STATIC_REQUIRE(typed::static_world == 8);
  STATIC_REQUIRE(typed::static_offload == offload_kind::shared_cooperative);
  STATIC_REQUIRE(std::derived_from<typed, load_plan>);  // what the driver reads
  const auto b = make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::shared_cooperative);
  REQUIRE(a.read_bytes == b.read_bytes);
  REQUIRE(a.windows == b.windows);
  REQUIRE(make_schedule(a).digest == make_schedule(b).digest);
}

TEST_CASE("EP rank r owns the r-th contiguous block of E/EP experts and reads them itself", "[policy][plan]") {
  const auto tensors = deepseek_like();
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::shared_cooperative);
  REQUIRE(p.experts == 16);
  std::size_t experts = 0;
  for (const auto& e : p.entries) {
    if (e.info.cls != tensor_class::routed_expert) {
      REQUIRE(e.owners == rank_set::all(8));
      continue;
    }
    ++experts;
    const auto owner = static_cast<rank_t>(e.info.expert / 2);
    REQUIRE(e.owners.members() == std::vector<rank_t>{owner});
    REQUIRE(p.reader(e.info) == owner);
    REQUIRE_FALSE(e.reads.front().exchanged);
    REQUIRE(p.destination(e.info, owner) == destination::device);
    REQUIRE(p.destination(e.info, (owner + 1) % 8) == destination::none);
  }
  REQUIRE(experts > 0);
}

TEST_CASE("round-robin placement: EP rank r owns experts r, r + EP, ... (vLLM's round_robin) and reads them itself",
          "[policy][plan]") {
  const auto tensors = deepseek_like();
  plan_options o;
  o.experts = expert_placement::round_robin;
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::none, o);
  const auto linear = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::none);
  REQUIRE(p.experts == 16);
  std::size_t experts = 0, moved = 0;
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    const auto& e = p.entries[i];
    if (e.info.cls != tensor_class::routed_expert) {
      REQUIRE(e.owners == linear.entries[i].owners);
      continue;
    }
    ++experts;
    const auto owner = static_cast<rank_t>(e.info.expert % 4);
    REQUIRE(e.owners.members() == std::vector<rank_t>{owner});
    REQUIRE(p.reader(e.info) == owner);
    REQUIRE_FALSE(e.reads.front().exchanged);
    if (linear.entries[i].owners != e.owners) ++moved;
  }
  REQUIRE(experts > 0);
  REQUIRE(moved > 0);  // not linear's blocks under another name
  // Each rank still reads a quarter of the experts' bytes, and nothing is exchanged for them.
  REQUIRE(std::accumulate(p.read_bytes.begin(), p.read_bytes.end(), std::uint64_t{0}) == total(tensors));
  require_reads_tile(p);
}

TEST_CASE("expert placement names: vLLM's two, and a config error naming anything else", "[policy][plan]") {
  REQUIRE(parse_expert_placement("linear") == expert_placement::linear);
  REQUIRE(parse_expert_placement("round_robin") == expert_placement::round_robin);
  REQUIRE(parse_expert_placement("round-robin") == expert_placement::round_robin);
  REQUIRE_THROWS_MATCHES(parse_expert_placement("random"), config_error,
                         Catch::Message("expert placement 'random': expected linear or round_robin"));
}

TEST_CASE("shared tables: each local rank writes one range of the segment (cooperative), or one reader each (single)",
          "[policy][plan][offload]") {
  const auto tensors = deepseek_like(64u << 20);
  const auto coop = make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::shared_cooperative);
  const auto single = make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::shared_single);
  std::size_t tables = 0;
  std::vector<std::uint64_t> written(8, 0), first(8, ~std::uint64_t{0}), last(8, 0);
  std::uint64_t table_bytes = 0;
  for (std::size_t i = 0; i < coop.entries.size(); ++i) {
    const auto& c = coop.entries[i];
    const auto& s = single.entries[i];
    if (c.info.cls != tensor_class::shared_table) continue;
    ++tables;
    REQUIRE(c.shared());
    REQUIRE(c.shared_offset % 4096 == 0);
    REQUIRE(c.shared_offset + c.info.size <= coop.shared_bytes);
    table_bytes += c.info.size;
    for (std::size_t k = 0; k < c.reads.size(); ++k) {
      const auto& r = c.reads[k];
      REQUIRE_FALSE(r.exchanged);
      if (k > 0) REQUIRE(r.reader > c.reads[k - 1].reader);  // in the writers' order
      written[r.reader] += r.size;
      first[r.reader] = std::min(first[r.reader], c.shared_offset + r.offset);
      last[r.reader] = std::max(last[r.reader], c.shared_offset + r.offset + r.size);
    }
    REQUIRE(s.reads.size() == 1);
    REQUIRE(coop.destination(c.info, 3) == destination::shared_host);
  }
  REQUIRE(tables == 4);  // 2 tables x (table, scale)
  require_reads_tile(coop);
  // Each local rank's bytes lie in one range of the segment, after the
  // previous rank's, and the ranges are even to within a piece's alignment.
  std::uint64_t sum = 0;
  for (std::size_t k = 0; k < 8; ++k) {
    sum += written[k];
    if (written[k] == 0) continue;
    if (k > 0 && written[k - 1] > 0) REQUIRE(first[k] >= last[k - 1]);
    const auto even = coop.shared_bytes / 8;
    REQUIRE(written[k] + (std::uint64_t{2} << 20) >= even);
    REQUIRE(written[k] <= even + (std::uint64_t{2} << 20));
  }
  REQUIRE(sum == table_bytes);
  // The pieces: ascending pages from 0, four per local rank (segment_lanes),
  // and no piece written by two ranks.
  const auto& pieces = coop.segment_pieces;
  REQUIRE(pieces.size() == 32);
  REQUIRE(pieces.front() == 0);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    REQUIRE(pieces[i] % 4096 == 0);
    REQUIRE(pieces[i] < coop.shared_bytes);
    if (i > 0) REQUIRE(pieces[i] > pieces[i - 1]);
  }
  auto piece_of = [&](std::uint64_t at) {
    return static_cast<std::size_t>(std::upper_bound(pieces.begin(), pieces.end(), at) - pieces.begin() - 1);
  };
  std::vector<int> writer(pieces.size(), -1);
  for (const auto& e : coop.entries)
    for (const auto& r : e.reads) {
      if (!e.shared()) continue;
      for (auto i = piece_of(e.shared_offset + r.offset); i <= piece_of(e.shared_offset + r.offset + r.size - 1); ++i) {
        if (writer[i] < 0) writer[i] = static_cast<int>(r.reader);
        REQUIRE(writer[i] == static_cast<int>(r.reader));
      }
    }
  const auto per_rank = make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::per_rank_host);
  REQUIRE(per_rank.shared_bytes == 0);
  REQUIRE(per_rank.segment_pieces.empty());
  REQUIRE(per_rank.entry("model.engram.0.table").owner_destination == destination::host);
  REQUIRE(per_rank.entry("model.engram.0.table").reads.front().exchanged);
}

TEST_CASE("the segment's pieces: at most 64 in all, past 16 local ranks fewer per rank", "[policy][plan][offload]") {
  const auto tensors = deepseek_like(64u << 20);
  for (std::size_t ranks : {1u, 2u, 16u, 32u, 128u}) {
    INFO(ranks);
    const auto p = make_plan(tensors, classifier::deepseek(), 1, ranks, 1, offload_kind::shared_cooperative);
    REQUIRE_FALSE(p.segment_pieces.empty());
    REQUIRE(p.segment_pieces.size() <= max_segment_pieces);
    require_reads_tile(p);
  }
}

TEST_CASE("two nodes each read their own copy of a shared table", "[policy][plan][offload]") {
  const auto tensors = deepseek_like(64u << 20);
  plan_options o;
  o.local_size = 4;
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::shared_cooperative, o);
  const auto& t = p.entry("model.engram.0.table");
  // The reads of node 0's copy, then node 1's: the same cuts, each by the same local rank.
  REQUIRE(t.reads.size() % 2 == 0);
  const auto half = t.reads.size() / 2;
  for (std::size_t k = 0; k < half; ++k) {
    REQUIRE(p.node_of(t.reads[k].reader) == 0);
    REQUIRE(p.node_of(t.reads[half + k].reader) == 1);
    REQUIRE(t.reads[half + k].reader == t.reads[k].reader + 4);
    REQUIRE(t.reads[half + k].offset == t.reads[k].offset);
  }
  require_reads_tile(p);
  REQUIRE_THROWS_AS(make_plan(tensors, classifier::deepseek(), 1, 8, 8, offload_kind::none, {3}), config_error);
}

TEST_CASE("TP2: row-split weights plan one read per TP part, by a rank that keeps it", "[policy][plan][topology]") {
  const auto tensors = deepseek_like(64u << 20);
  const auto p = make_plan(tensors, classifier::deepseek(), 2, 4, 8, offload_kind::shared_cooperative);
  REQUIRE(p.world == 8);
  const auto& q = p.entry("model.layers.0.self_attn.q_proj.weight");
  REQUIRE(q.split == tp_split::rows);
  REQUIRE(p.kept_bytes(q) == q.info.size / 2);
  REQUIRE(q.reads.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    REQUIRE(q.reads[k].offset == k * q.info.size / 2);
    REQUIRE(p.tp_rank(q.reads[k].reader) == k);  // read by a keeper of part k
  }
  REQUIRE(p.kept_begin(q, 1) == q.info.size / 2);
  // Each message carries a part to a DP replica of its keeper, and nowhere else.
  std::vector<std::uint64_t> got(p.world, 0);
  p.for_each_message(q, [&](const planned_message& m) {
    REQUIRE(p.tp_rank(m.to) == p.tp_rank(q.reads[m.read].reader));
    REQUIRE(m.size == q.info.size / 2);
    REQUIRE(m.at == 0);
    got[m.to] += m.size;
  });
  for (rank_t r = 0; r < 8; ++r) REQUIRE(got[r] == (r == q.reads[0].reader || r == q.reads[1].reader ? 0 : q.info.size / 2));
  // Row-parallel weights split by columns; their norms and biases stay whole.
  const auto& o = p.entry("model.layers.0.self_attn.o_proj.weight");
  REQUIRE(o.split == tp_split::columns);
  REQUIRE(p.entry("model.layers.0.input_layernorm.weight").split == tp_split::none);
  require_reads_tile(p);
  REQUIRE(p.read_imbalance() <= 1.05);
}

TEST_CASE("TP without EP: every TP rank keeps a part of every routed expert", "[policy][plan][topology]") {
  const auto tensors = deepseek_like(64u << 20);
  const auto p = make_plan(tensors, classifier::deepseek(), 4, 2, 1, offload_kind::none);
  std::size_t split = 0;
  for (const auto& e : p.entries) {
    if (e.info.cls != tensor_class::routed_expert || !e.info.name.ends_with("proj.weight")) continue;
    REQUIRE(e.owners.size() == 8);
    REQUIRE(e.split == (e.info.name.find("down_proj") != std::string::npos ? tp_split::columns : tp_split::rows));
    ++split;
  }
  REQUIRE(split > 0);
  // With EP, experts stay whole on their EP rank.
  const auto q = make_plan(tensors, classifier::deepseek(), 4, 2, 8, offload_kind::none);
  for (const auto& e : q.entries)
    if (e.info.cls == tensor_class::routed_expert) REQUIRE(e.split == tp_split::none);
  require_reads_tile(p);
}

TEST_CASE("TP: a column split sends each rank its columns of the rows read, packed", "[policy][plan][topology]") {
  std::vector<tensor_info> tensors{{"model.layers.0.self_attn.o_proj.weight", 64 * 32 * 2, {64, 32}},
                                   {"model.layers.0.mlp.down_proj.weight", 64 * 30 * 2, {64, 30}},  // 30 % 4: whole
                                   {"model.layers.0.input_layernorm.weight", 64 * 2, {64}}};
  plan_options o;
  o.split_bytes = 1024;  // blocks of rows across readers
  o.uneven_tp_keep_whole = true;  // down_proj: 30 columns, kept whole on request
  const auto p = make_plan(tensors, classifier::deepseek(), 4, 1, 1, offload_kind::none, o);
  REQUIRE(p.kept_whole == std::vector<std::string>{"model.layers.0.mlp.down_proj.weight"});
  const auto& w = p.entry("model.layers.0.self_attn.o_proj.weight");
  REQUIRE(w.split == tp_split::columns);
  REQUIRE(p.entry("model.layers.0.mlp.down_proj.weight").split == tp_split::none);
  REQUIRE(w.reads.size() == 4);
  std::uint64_t rows = 0;
  for (const auto& r : w.reads) {
    REQUIRE(r.offset % (32 * 2) == 0);  // whole rows
    REQUIRE(r.size % (32 * 2) == 0);
    rows += r.size / (32 * 2);
  }
  REQUIRE(rows == 64);
  // Every rank ends with its 64 x 8 part: what it receives plus its own cut of what it read.
  std::vector<std::uint64_t> have(4, 0);
  p.for_each_message(w, [&](const planned_message& m) {
    REQUIRE(m.part == p.tp_rank(m.to));
    REQUIRE(m.to != w.reads[m.read].reader);
    REQUIRE(m.at == w.reads[m.read].offset / (32 * 2) * 8 * 2);
    have[m.to] += m.size;
  });
  for (const auto& r : w.reads) have[r.reader] += r.size / 4;
  for (auto h : have) REQUIRE(h == 64 * 8 * 2);
  REQUIRE(p.received_bytes[0] + p.received_bytes[1] + p.received_bytes[2] + p.received_bytes[3] ==
          3 * w.info.size / 4 + 3 * (64 * 30 * 2) + 3 * 64 * 2);
}

TEST_CASE("windows cut the non-shared bytes in file order", "[policy][plan]") {
  const auto tensors = deepseek_like(64u << 20);
  plan_options o;
  o.window_bytes = 1u << 20;
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 4, 4, offload_kind::shared_single, o);
  REQUIRE(p.windows > 1);
  std::map<std::uint32_t, std::uint64_t> bytes;
  std::uint32_t prev = 0;
  for (const auto& e : p.entries) {
    REQUIRE(e.window >= prev);
    prev = e.window;
    if (!e.shared()) bytes[e.window] += e.info.size;
  }
  for (auto [w, b] : bytes) {
    INFO("window " << w);
    if (b > o.window_bytes) REQUIRE(std::count_if(p.entries.begin(), p.entries.end(), [&](auto& e) { return e.window == w && !e.shared(); }) == 1);
  }
}

namespace {
// The ranks of pipeline stage k in a plan.
rank_set stage_set(const load_plan& p, std::size_t k) {
  rank_set s(p.world);
  for (std::size_t r = 0; r < p.pp_stage_size(); ++r) s.insert(static_cast<rank_t>(k * p.pp_stage_size() + r));
  return s;
}
bool subset(const rank_set& a, const rank_set& b) {
  for (auto r : a.members())
    if (!b.contains(r)) return false;
  return true;
}
}  // namespace

TEST_CASE("TP4xPP2: a stage owns a contiguous range of layers, embeddings first, norm and lm_head last", "[policy][plan][pp]") {
  const auto tensors = deepseek_like(64u << 20);  // 6 layers + the draft layer 6
  const auto p = make_plan(tensors, classifier::deepseek(), parse_topology("tp4,pp2"), offload_kind::shared_cooperative);
  REQUIRE(p.pp == 2);
  REQUIRE(p.world == 8);
  REQUIRE(p.layers == 7);
  // 7 layers over 2 stages: the extra one to the stage before the last (vLLM's split).
  REQUIRE(p.pp_stage_begin == std::vector<std::uint64_t>{0, 4, 7});
  REQUIRE(p.entry("model.embed_tokens.weight").stage == 0);
  REQUIRE(p.entry("model.embed_tokens.weight").owners == stage_set(p, 0));
  REQUIRE(p.entry("model.norm.weight").stage == 1);
  REQUIRE(p.entry("lm_head.weight").owners == stage_set(p, 1));
  REQUIRE(p.entry("model.layers.3.input_layernorm.weight").owners == stage_set(p, 0));
  REQUIRE(p.entry("model.layers.4.input_layernorm.weight").owners == stage_set(p, 1));
  REQUIRE(p.entry("model.engram.0.norm.weight").stage == -1);  // layer-less, neither anchor: every stage
  REQUIRE(p.entry("model.engram.0.table").owners == rank_set::all(8));
  for (const auto& e : p.entries) {
    INFO(e.info.name);
    if (e.info.layer >= 0) {
      const auto k = static_cast<std::size_t>(e.stage);
      REQUIRE(static_cast<std::uint64_t>(e.info.layer) >= p.pp_stage_begin[k]);
      REQUIRE(static_cast<std::uint64_t>(e.info.layer) < p.pp_stage_begin[k + 1]);
      REQUIRE(subset(e.owners, stage_set(p, k)));
    }
    if (e.shared()) continue;
    for (const auto& r : e.reads) REQUIRE(e.owners.contains(r.reader));  // readers respect stages
  }
  require_reads_tile(p);
  REQUIRE(std::accumulate(p.read_bytes.begin(), p.read_bytes.end(), std::uint64_t{0}) == total(tensors));
  // TP slices still cut row-parallel weights within a stage.
  const auto& q = p.entry("model.layers.5.self_attn.q_proj.weight");
  REQUIRE(q.split == tp_split::rows);
  REQUIRE(q.reads.size() == 4);
  for (const auto& r : q.reads) REQUIRE(p.pp_stage_of(r.reader) == 1);
}

TEST_CASE("PP with experts: each stage holds every expert of its layers, EP within the stage", "[policy][plan][pp]") {
  const auto tensors = deepseek_like(64u << 20);  // 16 experts
  const auto p = make_plan(tensors, classifier::deepseek(), parse_topology("dp4,ep4,pp2"), offload_kind::none);
  for (const auto& e : p.entries) {
    if (e.info.cls != tensor_class::routed_expert) continue;
    const auto k = static_cast<std::size_t>(e.stage);
    REQUIRE(e.owners.members() == std::vector<rank_t>{static_cast<rank_t>(k * 4 + static_cast<std::size_t>(e.info.expert) / 4)});
    REQUIRE(p.reader(e.info) == e.owners.members().front());
  }
}

TEST_CASE("PP options: explicit stage split, even_pp_stages, configurable anchors and layer pattern", "[policy][plan][pp]") {
  const auto tensors = deepseek_like(64u << 20);  // 7 layer indices
  const auto topo = parse_topology("tp4,pp2");
  plan_options o;
  o.pp_stage_layers = {2, 5};
  REQUIRE(make_plan(tensors, classifier::deepseek(), topo, offload_kind::none, o).pp_stage_begin ==
          std::vector<std::uint64_t>{0, 2, 7});
  o.pp_stage_layers = {2, 4};
  REQUIRE_THROWS_WITH(make_plan(tensors, classifier::deepseek(), topo, offload_kind::none, o),
                      Catch::Contains("add up to 6, the checkpoint has 7 layers"));
  o.pp_stage_layers = {};
  o.even_pp_stages = true;
  REQUIRE_THROWS_WITH(make_plan(tensors, classifier::deepseek(), topo, offload_kind::none, o),
                      Catch::Contains("PP=2 does not divide the 7 layers"));
  REQUIRE_THROWS_WITH(make_plan(tensors, classifier::deepseek(), parse_topology("pp8"), offload_kind::none),
                      Catch::Contains("PP=8 stages exceed the 7 layers"));
  // lm_head with the first stage, by option.
  classify_options co = classifier::deepseek().options();
  co.first_pp_stage_pattern = R"((^|\.)(embed_tokens|lm_head)\.)";
  const auto p = make_plan(tensors, classifier(co), topo, offload_kind::none);
  REQUIRE(p.entry("lm_head.weight").stage == 0);
  REQUIRE(p.entry("model.norm.weight").stage == 1);
  co.layer_pattern = R"(no_such_layers\.(\d+)\.)";
  REQUIRE_THROWS_WITH(make_plan(tensors, classifier(co), topo, offload_kind::none),
                      Catch::Contains("no tensor name has a layer index"));
}

TEST_CASE("experts that do not spread over EP are a config error naming the numbers", "[policy][plan]") {
  auto tensors = deepseek_like(64u << 20);  // 16 experts
  REQUIRE_THROWS_WITH(make_plan(tensors, classifier::deepseek(), 1, 6, 6, offload_kind::none),
                      Catch::Contains("16 routed experts per layer do not spread evenly over EP=6"));
  plan_options o;
  o.uneven_experts = true;
  REQUIRE_NOTHROW(make_plan(tensors, classifier::deepseek(), 1, 6, 6, offload_kind::none, o));
  REQUIRE_NOTHROW(make_plan(deepseek_like(), classifier::deepseek(), 1, 8, 8, offload_kind::none));
}

TEST_CASE("an expert or layer index that does not fit is a config error naming the tensor", "[policy][plan]") {
  const classifier c = classifier::deepseek();
  tensor_info huge{"model.layers.3.mlp.experts.99999999999999999999999.w1.weight", 16, {4, 4}};
  REQUIRE_THROWS_MATCHES(c.classify(huge), config_error,
                         Catch::Message("the expert index '99999999999999999999999' captured by the pattern is not a number "
                                        "below 2^32 (tensor 'model.layers.3.mlp.experts.99999999999999999999999.w1.weight')"));
  tensor_info big{"model.layers.3.mlp.experts.4294967296.w1.weight", 16, {4, 4}};
  REQUIRE_THROWS_AS(c.classify(big), config_error);
  tensor_info layer{"model.layers.18446744073709551616.self_attn.q_proj.weight", 16, {4, 4}};
  REQUIRE_THROWS_WITH(c.layer(layer), Catch::Contains("the layer index '18446744073709551616'"));
  // A user pattern whose group captures something that is not a number.
  classify_options o;
  o.expert_pattern = R"(experts\.([a-z]+)\.)";
  tensor_info named{"mlp.experts.left.weight", 16, {4, 4}};
  REQUIRE_THROWS_WITH(classifier(o).classify(named), Catch::Contains("the expert index 'left'"));
  tensor_info ok{"model.layers.3.mlp.experts.4294967295.w1.weight", 16, {4, 4}};
  c.classify(ok);
  CHECK(ok.expert == 4294967295);
  // Through the planner: the error surfaces before any I/O.
  REQUIRE_THROWS_AS(make_plan(std::vector<tensor_info>{huge}, c, 1, 1, 1, offload_kind::none), config_error);
}

TEST_CASE("a static model shape is checked at compile time and against the tensors", "[policy][plan][pp]") {
  const auto tensors = deepseek_like(64u << 20);  // 7 layer indices, 16 experts
  using good = plan<tp4_pp2, offload::none, model_shape<7, 16>>;
  STATIC_REQUIRE(std::same_as<good::shape_type, model_shape<7, 16>>);
  REQUIRE(good::compute(tp4_pp2{}, tensors).layers == 7);
  REQUIRE_THROWS_WITH((plan<tp4_pp2, offload::none, model_shape<8, 16>>::compute(tp4_pp2{}, tensors)),
                      Catch::Contains("says 8 layers, the tensors have 7"));
  REQUIRE_THROWS_WITH((plan<tp1_dp8_ep8, offload::none, model_shape<dynamic, 32>>::compute(tp1_dp8_ep8{}, tensors)),
                      Catch::Contains("says 32 routed experts per layer, the tensors have 16"));
}

TEST_CASE("a TP that does not divide a split tensor is an error naming it, or kept whole on request", "[policy][plan][tp]") {
  // q_proj (rows) 3 x 8 and o_proj (columns) 8 x 3: TP 2 divides neither; the norm is not split anyway.
  const std::vector<tensor_info> tensors{{"model.layers.0.self_attn.q_proj.weight", 3 * 8 * 2, {3, 8}},
                                         {"model.layers.0.self_attn.o_proj.weight", 8 * 3 * 2, {8, 3}},
                                         {"model.layers.0.input_layernorm.weight", 8 * 2, {8}},
                                         {"model.layers.0.mlp.down_proj.weight", 8 * 4 * 2, {8, 4}}};
  try {
    (void)make_plan(tensors, classifier::deepseek(), 2, 1, 1, offload_kind::none);
    FAIL("an uneven TP split was accepted silently");
  } catch (const config_error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("TP=2 does not divide the split dimension of 2 tensors") != std::string::npos);
    CHECK(m.find("'model.layers.0.self_attn.q_proj.weight'") != std::string::npos);
    CHECK(m.find("'model.layers.0.self_attn.o_proj.weight'") != std::string::npos);
    CHECK(m.find("down_proj") == std::string::npos);  // 4 columns: TP 2 divides it
    CHECK(m.find("layernorm") == std::string::npos);   // never split
  }
  plan_options keep;
  keep.uneven_tp_keep_whole = true;
  const auto p = make_plan(tensors, classifier::deepseek(), 2, 1, 1, offload_kind::none, keep);
  CHECK(p.kept_whole == std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"});
  for (const auto& e : p.entries) {
    INFO(e.info.name);
    CHECK(e.split == (e.info.name.find("down_proj") != std::string::npos ? tp_split::columns : tp_split::none));
  }
  // A TP that divides everything keeps nothing whole.
  CHECK(make_plan(tensors, classifier::deepseek(), 1, 2, 1, offload_kind::none).kept_whole.empty());
}

TEST_CASE("the engine's model owners override every name rule, a tensor no model takes is not read",
          "[policy][plan][model_owners]") {
  // Names sluice's classifier does not know as experts (a Mixtral's), one it
  // does (mlp.experts.N) given other owners, a table nobody takes.
  const std::vector<tensor_info> tensors{{"model.layers.0.block_sparse_moe.experts.0.w1.weight", 4096, {64, 32}},
                                         {"model.layers.0.block_sparse_moe.experts.1.w1.weight", 4096, {64, 32}},
                                         {"model.layers.0.mlp.experts.0.w1.weight", 4096, {64, 32}},
                                         {"model.layers.0.self_attn.q_proj.weight", 8192, {64, 64}},
                                         {"mtp.0.head.weight", 2048, {32, 32}}};
  auto owners = std::make_shared<std::map<std::string, model_owner>>();
  (*owners)["model.layers.0.block_sparse_moe.experts.0.w1.weight"].ranks = {0};
  (*owners)["model.layers.0.block_sparse_moe.experts.1.w1.weight"].ranks = {1};
  (*owners)["model.layers.0.mlp.experts.0.w1.weight"].ranks = {1};   // not the EP rule's rank 0
  (*owners)["model.layers.0.self_attn.q_proj.weight"].ranks = {0, 1};
  (*owners)["mtp.0.head.weight"].ranks = {};                          // the draft's: no main-model rank takes it
  plan_options o;
  o.model_owners = owners;
  const auto p = make_plan(tensors, classifier::deepseek(), 2, 1, 2, offload_kind::none, o);   // TP2 by the topology
  for (const auto& e : p.entries) {
    INFO(e.info.name);
    const auto& want = owners->at(e.info.name).ranks;
    CHECK(e.owners.members() == want);
    CHECK(e.split == tp_split::none);   // whole: the model narrows what it takes
    if (want.empty()) {
      CHECK(e.reads.empty());
    } else {
      std::uint64_t covered = 0;
      for (const auto& r : e.reads) {
        CHECK(e.owners.contains(r.reader));   // read by a rank that keeps it
        covered += r.size;
      }
      CHECK(covered == e.info.size);
    }
  }
  CHECK(p.unowned_tensors == 1);
  CHECK(p.unowned_bytes == 2048);
  CHECK(std::accumulate(p.read_bytes.begin(), p.read_bytes.end(), std::uint64_t{0}) == 4096 * 3 + 8192);
  CHECK(std::accumulate(p.received_bytes.begin(), p.received_bytes.end(), std::uint64_t{0}) == 8192);   // q_proj to the other
  // The owners are in the digest: another map is another plan.
  auto other = std::make_shared<std::map<std::string, model_owner>>(*owners);
  (*other)["model.layers.0.mlp.experts.0.w1.weight"].ranks = {0};
  plan_options o2;
  o2.model_owners = other;
  CHECK(make_schedule(p).digest != make_schedule(make_plan(tensors, classifier::deepseek(), 2, 1, 2, offload_kind::none, o2)).digest);
  // A rank outside the world is a config error naming the tensor.
  (*other)["mtp.0.head.weight"].ranks = {2};
  CHECK_THROWS_WITH(make_plan(tensors, classifier::deepseek(), 2, 1, 2, offload_kind::none, o2),
                    Catch::Contains("'mtp.0.head.weight'") && Catch::Contains("rank 2"));
}

TEST_CASE("the engine's model splits a tensor into parts: each owner reads or receives only its part",
          "[policy][plan][model_owners]") {
  // Four ranks: two replicas of a TP2 model (parts 0,1,0,1), as vLLM's
  // TP x DP; a row-parallel weight whose column parts the model gives in
  // the other order; a fused expert tensor whose dim-0 blocks two EP ranks keep.
  const std::vector<tensor_info> tensors{{"qkv", 64 * 32 * 2, {64, 32}},
                                         {"down", 16 * 64 * 2, {16, 64}},
                                         {"experts.input_linear", 8 * 4 * 16 * 2, {8, 4, 16}},
                                         {"norm", 64, {32}}};
  auto owners = std::make_shared<std::map<std::string, model_owner>>();
  (*owners)["qkv"] = {{0, 1, 2, 3}, tp_split::rows, 2, {0, 1, 0, 1}};
  (*owners)["down"] = {{0, 1}, tp_split::columns, 2, {1, 0}};
  (*owners)["experts.input_linear"] = {{2, 3}, tp_split::rows, 2, {0, 1}};
  (*owners)["norm"] = {{0, 1, 2, 3}};
  plan_options o;
  o.model_owners = owners;
  o.split_bytes = 1;   // read large tensors in slices, so that readers and parts differ
  const auto p = make_plan(tensors, classifier::deepseek(), 1, 4, 1, offload_kind::none, o);
  std::vector<std::uint64_t> got(4, 0);
  for (const auto& e : p.entries) {
    INFO(e.info.name);
    const auto& m = owners->at(e.info.name);
    CHECK(e.owners.members() == m.ranks);
    CHECK(e.split == m.split);
    std::uint64_t covered = 0;
    for (const auto& r : e.reads) covered += r.size;
    CHECK(covered == e.info.size);   // read once
    for (std::size_t i = 0; i < m.ranks.size(); ++i) {
      const auto q = m.ranks[i];
      if (m.split != tp_split::none) {
        CHECK(p.part_of(e, q) == m.part[i]);
        CHECK(p.kept_bytes(e) == e.info.size / m.parts);
      }
      // What q keeps arrives whole: its reads kept as read, plus its messages.
      std::uint64_t in = 0;
      for (const auto& r : e.reads)
        if (r.reader == q && p.keeps_as_read(e, r, q)) in += r.size;
      for (const auto& msg : p.messages_of(e)) {
        if (msg.to != q) continue;
        in += msg.size;
        got[q] += msg.size;
        if (m.split != tp_split::none) CHECK(msg.part == m.part[i]);
      }
      if (m.split == tp_split::columns) {   // a reader of whole rows cuts its own part from them
        for (const auto& r : e.reads)
          if (r.reader == q) in += r.size / m.parts;
      }
      CHECK(in == p.kept_bytes(e));
    }
  }
  CHECK(std::accumulate(p.received_bytes.begin(), p.received_bytes.end(), std::uint64_t{0}) ==
        std::accumulate(got.begin(), got.end(), std::uint64_t{0}));
  // qkv: each part read once and sent to its other keeper (size in all);
  // down: whole rows read by one owner, the other's part sent (size / 2);
  // input_linear: each block read by the one rank that keeps it (nothing
  // sent); norm: 3 receivers.
  CHECK(std::accumulate(got.begin(), got.end(), std::uint64_t{0}) == 64 * 32 * 2 + 16 * 64 + 0 + 3 * 64);
  const auto schedule = make_schedule(p);   // the layouts hold together
  CHECK(schedule.windows.size() == p.windows);

  auto bad = [&](const std::string& name, model_owner m) {
    auto o2 = o;
    auto map = std::make_shared<std::map<std::string, model_owner>>(*owners);
    (*map)[name] = std::move(m);
    o2.model_owners = map;
    return make_plan(tensors, classifier::deepseek(), 1, 4, 1, offload_kind::none, o2);
  };
  CHECK_THROWS_WITH(bad("down", {{0, 1}, tp_split::columns, 3, {0, 1}}),
                    Catch::Contains("'down'") && Catch::Contains("does not divide"));
  CHECK_THROWS_WITH(bad("down", {{0, 1}, tp_split::columns, 2, {0, 0}}),
                    Catch::Contains("no rank keeps part 1 of 2") && Catch::Contains("'down'"));
  CHECK_THROWS_WITH(bad("down", {{0, 1}, tp_split::columns, 2, {0, 2}}), Catch::Contains("part 2"));
  CHECK_THROWS_WITH(bad("norm", {{0, 1}, tp_split::columns, 2, {0, 1}}), Catch::Contains("'norm'"));   // 1-D: no columns
  CHECK_THROWS_WITH(bad("qkv", {{0, 1}, tp_split::rows, 2, {0}}), Catch::Contains("1 parts for 2 owners"));
  CHECK_THROWS_WITH(bad("down", {{0, 1}, tp_split::rows, 2, {0, 1}, 3}),   // 16 rows: 3 runs do not divide them
                    Catch::Contains("'down'") && Catch::Contains("of each of 3 runs") && Catch::Contains("does not divide"));

  // A fused tensor's runs (model_owner::groups): qkv's 64 rows as 4 runs of
  // 16, each rank keeping block k of 2 of every run; down's 64 columns as 2
  // runs. Each keeper's bytes still arrive once, as its blocks.
  auto runs = std::make_shared<std::map<std::string, model_owner>>(*owners);
  (*runs)["qkv"] = {{0, 1, 2, 3}, tp_split::rows, 2, {0, 1, 1, 0}, 4};
  (*runs)["down"] = {{0, 1}, tp_split::columns, 2, {1, 0}, 2};
  auto o3 = o;
  o3.model_owners = runs;
  const auto q = make_plan(tensors, classifier::deepseek(), 1, 4, 1, offload_kind::none, o3);
  for (const char* name : {"qkv", "down"}) {
    INFO(name);
    const auto& e = q.entry(name);
    CHECK(e.split == tp_split::columns);   // carried as a column split of the runs
    CHECK(e.groups == (std::string(name) == "qkv" ? 4u : 2u));
    CHECK(load_plan::row_bytes(e) == (std::string(name) == "qkv" ? 16u * 32 * 2 : 32u * 2));
    CHECK(q.kept_bytes(e) == e.info.size / 2);
    for (const auto k : e.owners.members()) {
      std::uint64_t in = 0;
      for (const auto& r : e.reads)
        if (r.reader == k) in += r.size / 2;   // its own block, cut from what it read
      for (const auto& msg : q.messages_of(e))
        if (msg.to == k) in += msg.size;
      CHECK(in == q.kept_bytes(e));
    }
  }
  CHECK(make_schedule(q).windows.size() == q.windows);

  // Unequal runs of dim 0 (a GQA QKV: q 32 rows, k 16, v 16), block k of 2
  // of each: read in whole runs, each keeper's bytes arriving once.
  auto odd = std::make_shared<std::map<std::string, model_owner>>(*owners);
  (*odd)["qkv"] = {{0, 1, 2, 3}, tp_split::rows, 2, {0, 1, 1, 0}, 1, {32, 16, 16}};
  auto o4 = o;
  o4.model_owners = odd;
  const auto u = make_plan(tensors, classifier::deepseek(), 1, 4, 1, offload_kind::none, o4);
  const auto& e = u.entry("qkv");
  CHECK(e.groups == 3);
  CHECK(e.run_ends == std::vector<std::uint64_t>{32 * 64, 48 * 64, 64 * 64});
  CHECK(load_plan::run_count(e) == 3);
  for (const auto& r : e.reads) {   // whole runs
    CHECK(std::count(e.run_ends.begin(), e.run_ends.end(), r.offset + r.size) == 1);
    CHECK((r.offset == 0 || std::count(e.run_ends.begin(), e.run_ends.end(), r.offset) == 1));
  }
  for (const auto k : e.owners.members()) {
    std::uint64_t in = 0;
    for (const auto& r : e.reads)
      if (r.reader == k) in += r.size / 2;
    for (const auto& msg : u.messages_of(e))
      if (msg.to == k) in += msg.size;
    CHECK(in == u.kept_bytes(e));
  }
  CHECK(make_schedule(u).windows.size() == u.windows);
  CHECK_THROWS_WITH(bad("qkv", {{0, 1}, tp_split::rows, 2, {0, 1}, 1, {32, 16, 15}}), Catch::Contains("'qkv'") && Catch::Contains("runs"));
  CHECK_THROWS_WITH(bad("qkv", {{0, 1}, tp_split::rows, 2, {0, 1}, 1, {32, 16}}), Catch::Contains("cover 48 of its 64 rows"));
  CHECK_THROWS_WITH(bad("down", {{0, 1}, tp_split::columns, 2, {0, 1}, 1, {8, 8}}), Catch::Contains("dimension 1"));
}
