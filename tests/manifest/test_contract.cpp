// Tests of include/sluice/manifest/contract.hpp: the recorder, per-layer
// contracts and their JSON form.

#include <utility>

#include <catch2/catch.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/load_file.hpp>
#include <sluice/manifest/contract.hpp>

#include "model_fixture.hpp"

using namespace sluice;
using namespace sluice::manifest;
using namespace manifest_test;

namespace {

bool decline_all(tensor_view) { return false; }
void accept_void(tensor_view) {}
bool accept_logged(tensor_view, application_log&) { return true; }
void void_logged(tensor_view, application_log&) {}

tensor_view view_of(const tensor_ref& t) {
  tensor_view v;
  v.tensor = &t;
  v.kind = view_kind::metadata;
  return v;
}

}  // namespace

TEST_CASE("whether a loader can decline is decided from its signature", "[manifest][contract]") {
  STATIC_REQUIRE(recorder<decltype(&decline_all)>::can_decline);
  STATIC_REQUIRE_FALSE(recorder<decltype(&accept_void)>::can_decline);
  STATIC_REQUIRE(recorder<decltype(&accept_logged)>::can_decline);
  STATIC_REQUIRE_FALSE(recorder<decltype(&void_logged)>::can_decline);
  STATIC_REQUIRE(recorder<engine_loader>::can_decline);
  STATIC_REQUIRE(sink<recorder<engine_loader>>);
  STATIC_REQUIRE_FALSE(recordable_loader<int (*)(tensor_view)>);
}

TEST_CASE("an EP rank that declines non-owned experts records only its own", "[manifest][contract]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  engine e;
  e.ep_rank = 1;
  e.ep_size = 2;
  recorder rec(engine_loader{&e});
  const auto st = load(ck, rec);  // the initial load, through the real pipeline
  CHECK(st.tensors == ck.tensors().size());
  CHECK(st.accepted == ck.tensors().size() - n_layers * n_experts / 2);
  const auto c = rec.freeze();

  for (int l = 0; l < n_layers; ++l) {
    const auto* lc = c.layer(l);
    REQUIRE(lc != nullptr);
    std::set<std::int64_t> experts;
    for (const auto& k : lc->keys)
      if (auto it = k.select.find("expert_id"); it != k.select.end()) experts.insert(std::get<std::int64_t>(it->second));
    CHECK(experts == std::set<std::int64_t>{1, 3});
    CHECK(lc->keys.size() == 3 + 2 + 1);  // q/k/v, own experts, norm
    CHECK(lc->keys.contains(application_key{fmt::format("model.layers.{}.mlp.experts.1.w1.weight", l),
                                            fmt::format("model.layers.{}.mlp.experts.w1", l),
                                            {{"expert_id", std::int64_t{1}}}}));
    CHECK_FALSE(lc->keys.contains(application_key{fmt::format("model.layers.{}.mlp.experts.0.w1.weight", l),
                                                  fmt::format("model.layers.{}.mlp.experts.w1", l),
                                                  {{"expert_id", std::int64_t{0}}}}));
  }
  // The bytes really landed, and only the owned experts were written.
  const auto& w1 = e.buffers.at("model.layers.2.mlp.experts.w1");
  CHECK(w1[1 * hidden * hidden] == pattern("model.layers.2.mlp.experts.1.w1.weight", 0, 0));
  CHECK(w1[0] == std::byte{0});
}

TEST_CASE("a declined tensor is not recorded and an accepted one is recorded after the call", "[manifest][contract]") {
  tensor_ref a{"a.weight", "a.weight", 0, format::dtype::U8, {4}, 0, 4};
  tensor_ref b{"b.weight", "b.weight", 0, format::dtype::U8, {4}, 4, 4};
  std::size_t seen_during_call = 99;
  recorder<std::function<bool(tensor_view, application_log&)>>* self = nullptr;
  recorder<std::function<bool(tensor_view, application_log&)>> rec(
      [&](tensor_view v, application_log& log) {
        seen_during_call = self->applications().size();
        log.record(v.name() + ".dst");
        return v.name() == "a.weight";
      });
  self = &rec;
  CHECK(rec.accept(view_of(a)));
  CHECK(seen_during_call == 0);  // not yet recorded while the loader runs
  CHECK_FALSE(rec.accept(view_of(b)));
  REQUIRE(rec.applications().size() == 1);
  CHECK(rec.applications()[0] == application_key{"a.weight", "a.weight.dst", {}});
}

TEST_CASE("a distributed placeholder never enters a contract, a probe view does", "[manifest][contract]") {
  tensor_ref a{"model.layers.0.a.weight", "a", 0, format::dtype::U8, {4}, 0, 4};
  int calls = 0;
  recorder rec([&calls](tensor_view) { ++calls; });  // cannot decline
  STATIC_REQUIRE_FALSE(decltype(rec)::can_decline);
  tensor_view placeholder = view_of(a);
  placeholder.kind = view_kind::placeholder;  // another rank owns it
  CHECK_FALSE(placeholder.carries_data());
  CHECK(placeholder.last());
  CHECK_FALSE(rec.accept(std::move(placeholder)));
  CHECK(calls == 0);  // not even offered: nothing is applied on this rank
  CHECK(rec.applications().empty());
  CHECK(rec.freeze().empty());
  CHECK(rec.accept(view_of(a)));  // a probe: what a load would apply
  CHECK(calls == 1);
  CHECK(rec.freeze().size() == 1);
}

TEST_CASE("a loader that throws records nothing", "[manifest][contract]") {
  tensor_ref a{"a", "a", 0, format::dtype::U8, {1}, 0, 1};
  recorder rec([](tensor_view v, application_log& log) {
    log.record(v.name());
    throw std::runtime_error("engine failure");
  });
  CHECK_THROWS_WITH(rec.accept(view_of(a)), "engine failure");
  CHECK(rec.applications().empty());
}

TEST_CASE("a loader without a log applies each tensor to the destination of its name", "[manifest][contract]") {
  tensor_ref a{"model.layers.7.x.weight", "x", 0, format::dtype::U8, {3}, 0, 3};
  recorder rec(&accept_void);
  CHECK(rec.accept(view_of(a)));
  const auto c = rec.freeze();
  REQUIRE(c.layer(7) != nullptr);
  CHECK(c.layer(7)->keys == std::set<application_key>{{"model.layers.7.x.weight", "model.layers.7.x.weight", {}}});
  CHECK(c.layer(7)->bytes == 3);
}

TEST_CASE("keys are grouped per layer by the destination name and non-layer tensors form their own group",
          "[manifest][contract]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  engine e;
  recorder rec(engine_loader{&e});
  for (const auto& t : ck.tensors()) rec.accept(view_of(t));
  const auto c = rec.freeze();
  CHECK(c.layers().size() == n_layers + 1);
  REQUIRE(c.layer(non_layer) != nullptr);
  CHECK(c.layer(non_layer)->sources() ==
        std::set<std::string>{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"});
  const auto* l1 = c.layer(1);
  REQUIRE(l1 != nullptr);
  CHECK(l1->keys.size() == 3 + n_experts + 1);
  CHECK(l1->bytes == 3 * 64 + n_experts * 64 + 8);
  for (const auto& k : l1->keys) CHECK(k.destination.starts_with("model.layers.1."));
  CHECK(c.size() == 3 + n_layers * (3 + n_experts + 1));
  CHECK(c.contains({"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.qkv_proj.weight", {{"shard_id", std::string("k")}}}));
}

TEST_CASE("a key lands in the layer of its destination, not of its source", "[manifest][contract]") {
  // The pattern matches both names: the source alone would say layer 3.
  tensor_ref a{"blk3.x", "blk3.x", 0, format::dtype::U8, {4}, 0, 4};
  recorder rec([](tensor_view, application_log& log) { log.record("model.layers.5.y"); }, {R"((?:blk|layers\.)(\d+)\.)"});
  CHECK(rec.grouping().layer_of("blk3.x") == 3);
  rec.accept(view_of(a));
  const auto c = rec.freeze();
  CHECK(c.layer(3) == nullptr);
  REQUIRE(c.layer(5) != nullptr);
  CHECK(c.layer(5)->keys == std::set<application_key>{{"blk3.x", "model.layers.5.y", {}}});
  CHECK(c.layer(5)->bytes == 4);
}

TEST_CASE("padding and derived destination buffers are never in the contract", "[manifest][contract]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  engine e;
  recorder rec(engine_loader{&e});
  load(ck, rec);
  const auto c = rec.freeze();
  for (const auto& [l, lc] : c.layers())
    for (const auto& k : lc.keys) CHECK(k.destination.find("rotary_cache") == std::string::npos);
  // The padded embedding is one application of its source, whatever its padding.
  CHECK(c.layer(non_layer)->keys.contains({"model.embed_tokens.weight", "model.embed_tokens.weight", {}}));
  CHECK(e.buffers.at("model.embed_tokens.weight").size() == 16 * hidden);
  CHECK(e.buffers.at("model.layers.0.rotary_cache")[0] == std::byte{1});  // derived: computed, not recorded
}

TEST_CASE("a configurable layer pattern groups keys by it", "[manifest][contract]") {
  tensor_ref a{"blocks_3_attn", "a", 0, format::dtype::U8, {1}, 0, 1};
  tensor_ref b{"model.layers.3.x", "b", 0, format::dtype::U8, {1}, 1, 1};
  recorder rec(&accept_void, {R"(blocks_(\d+)_)"});
  rec.accept(view_of(a));
  rec.accept(view_of(b));
  const auto c = rec.freeze();
  CHECK(c.layer_pattern() == R"(blocks_(\d+)_)");
  REQUIRE(c.layer(3) != nullptr);
  CHECK(c.layer(3)->sources() == std::set<std::string>{"blocks_3_attn"});
  CHECK(c.layer(non_layer)->sources() == std::set<std::string>{"model.layers.3.x"});
  CHECK_THROWS_AS(layer_grouping("no group"), config_error);
  CHECK_THROWS_AS(layer_grouping("(unclosed"), config_error);
}

TEST_CASE("a contract round-trips through JSON", "[manifest][contract]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  engine e;
  e.ep_size = 2;
  recorder rec(engine_loader{&e});
  for (const auto& t : ck.tensors()) rec.accept(view_of(t));
  const auto c = rec.freeze();

  const auto j = c.to_json();
  CHECK(j.at("version") == 1);
  CHECK(j.at("layers").at(0).at("layer").is_null());  // non-layer group first
  CHECK(contract::from_json(nlohmann::json::parse(j.dump())) == c);

  save(c, dir.path() / "contract.json");
  const auto back = load_contract(dir.path() / "contract.json");
  CHECK(back == c);
  CHECK(back.layer(2)->keys.contains({"model.layers.2.mlp.experts.2.w1.weight", "model.layers.2.mlp.experts.w1",
                                      {{"expert_id", std::int64_t{2}}}}));
  CHECK(back.layer(2)->keys.contains({"model.layers.2.self_attn.v_proj.weight", "model.layers.2.self_attn.qkv_proj.weight",
                                      {{"shard_id", std::string("v")}}}));

  CHECK_THROWS_AS(contract::from_json(nlohmann::json::parse(R"({"version": 2})")), contract_error);
  CHECK_THROWS_AS(contract::from_json(nlohmann::json::parse(R"({"version": 1, "layers": []})")), contract_error);
  const auto bad_selector = nlohmann::json::parse(
      R"j({"version":1,"layer_pattern":"x(\\d)","layers":[{"layer":0,"bytes":1,"keys":[{"source":"a","destination":"b","selectors":{"s":1.5}}]}]})j");
  CHECK_THROWS_AS(contract::from_json(bad_selector), contract_error);
}

TEST_CASE("a contract key without a source is refused when read", "[manifest][contract]") {
  const auto no_source = nlohmann::json::parse(
      R"({"version":1,"layer_pattern":"layers\\.(\\d+)\\.","layers":[{"layer":2,"bytes":1,"keys":[{"source":"","destination":"model.layers.2.y","selectors":{}}]}]})");
  try {
    (void)contract::from_json(no_source);
    FAIL("a key without a source was read");
  } catch (const contract_error& err) {
    CHECK(std::string(err.what()) == R"(contract JSON: a key of layer 2 (destination 'model.layers.2.y') has an empty "source")");
  }
  auto ok = no_source;
  ok["layers"][0]["keys"][0]["source"] = "model.layers.2.x";
  CHECK(contract::from_json(ok).layer(2)->sources() == std::set<std::string>{"model.layers.2.x"});
}

TEST_CASE("a key names its source, destination and selectors", "[manifest][contract]") {
  const application_key k{"src", "dst", {{"expert_id", std::int64_t{3}}, {"shard_id", std::string("q")}}};
  CHECK(to_string(k) == "src -> dst {expert_id=3, shard_id='q'}");
  CHECK(to_string(application_key{"a", "b", {}}) == "a -> b");
  CHECK(layer_name(non_layer) == "non-layer tensors");
  CHECK(layer_name(4) == "layer 4");
}
