#include <catch2/catch.hpp>

#include <sluice/policy/classify.hpp>
#include <sluice/policy/offload.hpp>
#include <sluice/policy/topology.hpp>

using namespace sluice;
using namespace sluice::policy;

TEST_CASE("a static topology stores no sizes and derives rank coordinates", "[policy][topology]") {
  STATIC_REQUIRE(tp1_dp8_ep8::is_static);
  STATIC_REQUIRE(sizeof(tp1_dp8_ep8) == 1);
  constexpr tp1_dp8_ep8 t;
  STATIC_REQUIRE(t.world_size() == 8);
  STATIC_REQUIRE(t.coords(5) == rank_coords{5, 0, 5, 5});
  constexpr topology<2, 4, 4> t2;
  STATIC_REQUIRE(t2.coords(5) == rank_coords{5, 1, 2, 1});
  REQUIRE_THROWS_AS(t.coords(8), config_error);
}

TEST_CASE("a dynamic topology is checked at run time", "[policy][topology]") {
  const dynamic_topology t(2, 4, 8);
  REQUIRE(t.world_size() == 8);
  REQUIRE(t.coords(7).tp_rank == 1);
  REQUIRE(t.coords(7).dp_rank == 3);
  REQUIRE_THROWS_WITH(dynamic_topology(1, 8, 3), Catch::Contains("EP=3 does not divide the world size TP*DP=8"));
  REQUIRE_THROWS_AS(dynamic_topology(0, 8, 1), config_error);
  REQUIRE_THROWS_AS((topology<1, dynamic, 8>(2, 8, 8)), config_error);
  REQUIRE((topology<1, dynamic, 8>(1, 8, 8)).dp() == 8);
}

TEST_CASE("topologies parse from tp1,dp8,ep8 strings", "[policy][topology]") {
  auto t = parse_topology("tp1,dp8,ep8");
  REQUIRE(t.tp() == 1);
  REQUIRE(t.dp() == 8);
  REQUIRE(t.ep() == 8);
  REQUIRE(t.to_string() == "tp1,dp8,ep8");
  REQUIRE(parse_topology("dp4").world_size() == 4);
  REQUIRE(parse_topology("dp4").ep() == 1);
  REQUIRE_THROWS_WITH(parse_topology("tp1,xx8"), Catch::Contains("cannot parse 'xx8'"));
  REQUIRE_THROWS_AS(parse_topology("tp1,dp8,ep3"), config_error);
}

TEST_CASE("the DeepSeek preset classifies experts, tables and the rest", "[policy][classify]") {
  const auto c = classifier::deepseek();
  auto e = c(tensor_info{"model.layers.3.mlp.experts.12.gate_proj.weight", 10, {4, 4}});
  REQUIRE(e.cls == tensor_class::routed_expert);
  REQUIRE(e.expert == 12);
  REQUIRE(c(tensor_info{"model.layers.3.mlp.experts.7.down_proj.weight_scale_inv", 4, {1}}).expert == 7);
  REQUIRE(c(tensor_info{"model.layers.3.mlp.shared_experts.gate_proj.weight", 4, {1}}).cls == tensor_class::replicated);
  REQUIRE(c(tensor_info{"model.layers.3.mlp.gate.weight", 4, {1}}).cls == tensor_class::replicated);
  REQUIRE(c(tensor_info{"model.engram.0.table", 4, {1}}).cls == tensor_class::shared_table);
  REQUIRE(c(tensor_info{"model.engram.1.scale", 4, {1}}).cls == tensor_class::shared_table);
  REQUIRE(c(tensor_info{"model.engram.1.norm.weight", 4, {1}}).cls == tensor_class::replicated);
  REQUIRE(c.row_sliced(tensor_info{"model.layers.0.self_attn.q_proj.weight", 4, {2, 2}}));
  REQUIRE_FALSE(c.row_sliced(tensor_info{"model.layers.0.self_attn.o_proj.weight", 4, {2, 2}}));
}

TEST_CASE("a size threshold makes any large tensor a table", "[policy][classify]") {
  classify_options o;
  o.table_min_bytes = 1000;
  const classifier c(o);
  REQUIRE(c(tensor_info{"big", 1000, {1000}}).cls == tensor_class::shared_table);
  REQUIRE(c(tensor_info{"small", 999, {999}}).cls == tensor_class::replicated);
  REQUIRE_THROWS_AS(classifier(classify_options{"(", "", 0, ""}), config_error);
}

TEST_CASE("PP stages are contiguous blocks of TP x DP ranks, topology<TP, DP, EP> keeps PP = 1", "[policy][topology]") {
  STATIC_REQUIRE(tp1_dp8_ep8::static_pp == 1);
  STATIC_REQUIRE(tp4_pp2::is_static);
  STATIC_REQUIRE(sizeof(tp4_pp2) == 1);
  constexpr tp4_pp2 t;
  STATIC_REQUIRE(t.world_size() == 8);
  STATIC_REQUIRE(t.pp_stage_size() == 4);
  STATIC_REQUIRE(t.coords(3) == rank_coords{3, 3, 0, 0, 0});
  STATIC_REQUIRE(t.coords(5) == rank_coords{5, 1, 0, 0, 1});
  constexpr topology<2, 2, 4, 2> u;
  STATIC_REQUIRE(u.coords(6) == rank_coords{6, 0, 1, 2, 1});
  REQUIRE_THROWS_AS(t.coords(8), config_error);
  REQUIRE(t.to_string() == "tp4,dp1,ep1,pp2");
  REQUIRE(tp1_dp8_ep8{}.to_string() == "tp1,dp8,ep8");
  REQUIRE_THROWS_AS(dynamic_topology(4, 1, 1, 0), config_error);
  REQUIRE_THROWS_AS((topology<4, 1, 1, 2>(4, 1, 1, 3)), config_error);
}

TEST_CASE("parse_topology reads pp", "[policy][topology]") {
  const auto t = parse_topology("tp4,pp2");
  REQUIRE(t.tp() == 4);
  REQUIRE(t.pp() == 2);
  REQUIRE(t.dp() == 1);
  REQUIRE(t.world_size() == 8);
  REQUIRE(t.coords(6).pp_rank == 1);
  REQUIRE(t.coords(6).tp_rank == 2);
  REQUIRE(parse_topology("tp1,dp8,ep8").pp() == 1);
  REQUIRE(parse_topology("dp2,ep2,pp4").world_size() == 8);
  REQUIRE_THROWS_WITH(parse_topology("tp4,pp0"), Catch::Contains("PP must be >= 1"));
  REQUIRE_THROWS_WITH(parse_topology("tp4,ppx"), Catch::Contains("cannot parse 'ppx'"));
}

TEST_CASE("topology and offload literals are parsed at compile time, by the run-time parser", "[policy][topology]") {
  // Literals and static types: known without a run-time parse (these are constant expressions).
  constexpr topology_spec t = "tp2,dp4,ep8";
  STATIC_REQUIRE(t.parsed());
  STATIC_REQUIRE(t.sizes() == topology_sizes{2, 4, 8, 1});
  constexpr topology_spec typed = tp4_pp2{};
  STATIC_REQUIRE(typed.parsed());
  STATIC_REQUIRE(typed.sizes() == topology_sizes{4, 1, 1, 2});
  STATIC_REQUIRE(parse_topology_sizes("dp2, ep2 ,pp4") == topology_sizes{1, 2, 2, 4});
  constexpr offload_spec o = "shared-cooperative";
  STATIC_REQUIRE(o.parsed());
  STATIC_REQUIRE(o.kind() == offload_kind::shared_cooperative);
  STATIC_REQUIRE(offload_spec(offload::per_rank_host{}).kind() == offload_kind::per_rank_host);
  REQUIRE(typed.text() == "tp4,dp1,ep1,pp2");
  REQUIRE(t.to_topology().world_size() == 8);
  // A run-time string: kept, and parsed by the same parser when asked.
  const std::string text = "tp2,dp4,ep8";
  const topology_spec r = text;
  REQUIRE_FALSE(r.parsed());
  REQUIRE(r.sizes() == t.sizes());
  REQUIRE(r.text() == text);
  const std::string bad = "tp1,xx8";
  const topology_spec b = bad;  // no parse yet
  REQUIRE_THROWS_WITH(b.sizes(), Catch::Contains("topology 'tp1,xx8': cannot parse 'xx8'"));
  REQUIRE_THROWS_WITH(topology_spec(std::string_view("tp1,dp8,ep3")).sizes(), Catch::Contains("EP=3 does not divide the world size TP*DP=8"));
  REQUIRE_THROWS_WITH(topology_spec(std::string_view("tp99999999999999999999999")).sizes(), Catch::Contains("cannot parse"));
  const std::string pinned = "pinned";
  REQUIRE_THROWS_WITH(offload_spec(pinned).kind(), Catch::Contains("offload 'pinned': expected none, per-rank"));
  REQUIRE(offload_spec(std::string_view("per-rank")).kind() == offload_kind::per_rank_host);
}
