// Tests of include/sluice/manifest/reload.hpp: layerwise reload against a
// recorded contract.

#include <utility>

#include <algorithm>
#include <numeric>

#include <catch2/catch.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/load_file.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/manifest/reload.hpp>

#include "model_fixture.hpp"

using namespace sluice;
using namespace sluice::manifest;
using namespace manifest_test;

namespace {

std::vector<std::byte> bytes_of(const std::string& name, int gen) {
  const auto shape = shape_of(name);
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<std::byte> b(n);
  for (std::uint64_t i = 0; i < n; ++i) b[i] = pattern(name, i, gen);
  return b;
}

/// The contract of an initial load of generation 0 by `e` (through the real pipeline).
contract initial_load(engine& e) {
  temp_dir dir;
  write_model(dir.path(), 0);
  const auto ck = checkpoint::open(dir.path());
  recorder rec(engine_loader{&e});
  load(ck, rec);
  return rec.freeze();
}

/// Collects warnings and publish order.
struct observer {
  std::vector<std::string> warnings;
  std::vector<std::int64_t> published;
};

struct publish_hook {
  observer* o;
  void operator()(const layer_contract& lc) const { o->published.push_back(lc.layer); }
};

reload_options quiet(observer& o, bool require_all = true) {
  return {[&o](const std::string& w) { o.warnings.push_back(w); }, require_all};
}

bool mentions(const std::vector<std::string>& ws, const std::string& what) {
  return std::any_of(ws.begin(), ws.end(), [&](const std::string& w) { return w.find(what) != std::string::npos; });
}

}  // namespace

TEST_CASE("a full reload through load() publishes every layer with the new bytes", "[manifest][reload]") {
  engine e;
  e.ep_rank = 0;
  e.ep_size = 2;
  const auto c = initial_load(e);
  temp_dir dir;
  write_model(dir.path(), 1);
  const auto ck = checkpoint::open(dir.path());
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  load_options opt;
  opt.max_read = 16;  // every 64-byte tensor arrives in pieces
  opt.staging_budget = 4 * slot_size_for(16);
  const auto st = load(ck, s, opt);
  CHECK(st.tensors == ck.tensors().size());
  CHECK(o.published.size() == n_layers + 1);
  CHECK(o.warnings.empty());  // non-owned experts are declined silently, as in the initial load
  CHECK(s.stats().declined == n_layers * n_experts / 2);
  CHECK(s.stats().layers_published == n_layers + 1);
  CHECK(s.stats().buffered_bytes == 0);
  CHECK(s.last_incomplete().empty());
  const auto& qkv = e.buffers.at("model.layers.2.self_attn.qkv_proj.weight");
  CHECK(qkv[hidden * hidden + 5] == pattern("model.layers.2.self_attn.k_proj.weight", 5, 1));
  const auto& w1 = e.buffers.at("model.layers.1.mlp.experts.w1");
  CHECK(w1[2 * hidden * hidden + 63] == pattern("model.layers.1.mlp.experts.2.w1.weight", 63, 1));
  CHECK(w1[1 * hidden * hidden] == std::byte{0});  // not owned: never written
}

TEST_CASE("a reload of a subset fails naming exactly the missing keys", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  const auto before = e.buffers;
  temp_dir dir;
  const std::set<std::string> left_out{"model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.experts.3.w1.weight"};
  write_model(dir.path(), 1, [&](const std::string& n) { return !left_out.contains(n); });
  const auto ck = checkpoint::open(dir.path());
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));

  const std::vector<application_key> expected{
      {"model.layers.1.mlp.experts.3.w1.weight", "model.layers.1.mlp.experts.w1", {{"expert_id", std::int64_t{3}}}},
      {"model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.qkv_proj.weight", {{"shard_id", std::string("k")}}},
  };
  std::string message;
  try {
    (void)load(ck, s);
  } catch (const contract_error& err) {
    message = err.what();
  }
  INFO(message);
  REQUIRE_FALSE(message.empty());
  CHECK(message.find("layer 1 is missing 2 keys") != std::string::npos);
  for (const auto& k : expected) CHECK(message.find(to_string(k)) != std::string::npos);
  CHECK(message.find("layer 0") == std::string::npos);
  CHECK(message.find("layer 2") == std::string::npos);
  REQUIRE(s.last_incomplete().size() == 1);
  CHECK(s.last_incomplete().at(1) == expected);

  // The incomplete layer was never published: its buffers still hold generation 0.
  CHECK(std::find(o.published.begin(), o.published.end(), 1) == o.published.end());
  CHECK(o.published.size() == n_layers);
  CHECK(e.buffers.at("model.layers.1.self_attn.qkv_proj.weight") == before.at("model.layers.1.self_attn.qkv_proj.weight"));
  CHECK(e.buffers.at("model.layers.1.input_layernorm.weight") == before.at("model.layers.1.input_layernorm.weight"));
  CHECK(e.buffers.at("model.layers.0.input_layernorm.weight") == bytes_of("model.layers.0.input_layernorm.weight", 1));
  CHECK(s.stats().buffered_bytes == 0);  // the incomplete layer's buffers were freed
}

TEST_CASE("a partial update may require only the layers it touches", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o, false));
  for (const auto& k : c.layer(2)->sources()) s.push(k, format::dtype::U8, shape_of(k), bytes_of(k, 1));
  s.push("model.layers.0.input_layernorm.weight", format::dtype::U8, {hidden}, bytes_of("model.layers.0.input_layernorm.weight", 1));
  CHECK(o.published == std::vector<std::int64_t>{2});
  try {
    s.finish();
    FAIL("finish() accepted an incomplete touched layer");
  } catch (const contract_error& err) {
    CHECK(std::string(err.what()).find("layer 0 is missing") != std::string::npos);
    CHECK(std::string(err.what()).find("layer 1") == std::string::npos);  // untouched: not required
  }
}

TEST_CASE("extras warn and do not block a layer", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  const std::string extra = "model.layers.0.mlp.extra_bias";
  for (const auto& name : tensor_names()) {
    s.push(name, format::dtype::U8, shape_of(name), bytes_of(name, 1));
    if (name == "model.layers.0.self_attn.q_proj.weight") {
      s.push(extra, format::dtype::U8, {4}, std::vector<std::byte>(4, std::byte{9}));
      s.push(name, format::dtype::U8, shape_of(name), bytes_of(name, 2));  // arrives twice
    }
  }
  s.push("model.layers.7.unknown", format::dtype::U8, {2}, std::vector<std::byte>(2));  // no such layer
  s.push("model.layers.0.input_layernorm.weight", format::dtype::U8, {hidden}, bytes_of("model.norm.weight", 1));  // after publish
  CHECK_NOTHROW(s.finish());
  CHECK(o.published.size() == n_layers + 1);
  CHECK(mentions(o.warnings, extra));
  CHECK(mentions(o.warnings, "model.layers.0.self_attn.q_proj.weight' arrived twice"));
  CHECK(mentions(o.warnings, "model.layers.7.unknown"));
  CHECK(mentions(o.warnings, "model.layers.0.input_layernorm.weight' arrived again after layer 0 was published"));
  CHECK(o.warnings.size() == 4);
  CHECK(s.stats().extras == 4);
  CHECK(e.buffers.at(extra) == std::vector<std::byte>(4, std::byte{9}));  // the loader accepted it
  // The later copy replaced the earlier one.
  CHECK(e.buffers.at("model.layers.0.self_attn.qkv_proj.weight")[3] == pattern("model.layers.0.self_attn.q_proj.weight", 3, 2));
}

TEST_CASE("a padded destination completes its layer", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o, false));
  // The embedding's destination holds 16 rows; the source has 10: completion
  // is by keys, not bytes, so the padding never holds the group back.
  for (const char* n : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})
    s.push(n, format::dtype::U8, shape_of(n), bytes_of(n, 1));
  CHECK(o.published == std::vector<std::int64_t>{non_layer});
  // The layer with a derived buffer (rotary_cache) completes from its sources alone.
  for (const auto& src : c.layer(0)->sources()) s.push(src, format::dtype::U8, shape_of(src), bytes_of(src, 1));
  CHECK(o.published == std::vector<std::int64_t>{non_layer, 0});
  s.finish();
  CHECK(e.buffers.at("model.embed_tokens.weight").size() == 16 * hidden);
}

TEST_CASE("layers complete out of order across an interleaved update", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  // Round-robin over layers 2, 1, 0 (one tensor each), the non-layer group last;
  // layer 2 has its last tensor held back to the very end.
  std::vector<std::vector<std::string>> per_layer(n_layers);
  std::vector<std::string> others;
  for (const auto& n : tensor_names()) {
    const auto l = layer_grouping().layer_of(n);
    (l == non_layer ? others : per_layer[static_cast<std::size_t>(l)]).push_back(n);
  }
  const std::string held = per_layer[2].back();
  per_layer[2].pop_back();
  std::uint64_t max_incomplete_bytes = 0;
  for (std::size_t i = 0; i < per_layer[0].size(); ++i)
    for (int l = n_layers - 1; l >= 0; --l)
      if (i < per_layer[static_cast<std::size_t>(l)].size()) {
        const auto& n = per_layer[static_cast<std::size_t>(l)][i];
        s.push(n, format::dtype::U8, shape_of(n), bytes_of(n, 1));
      }
  for (const auto& n : others) s.push(n, format::dtype::U8, shape_of(n), bytes_of(n, 1));
  CHECK(o.published == std::vector<std::int64_t>{1, 0, non_layer});  // layer 1's last tensor comes before layer 0's
  CHECK_FALSE(s.published(2));
  s.push(held, format::dtype::U8, shape_of(held), bytes_of(held, 1));
  CHECK(o.published == std::vector<std::int64_t>{1, 0, non_layer, 2});
  s.finish();
  // Peak: never more than the layers incomplete at once (here all three layers
  // and the non-layer group could be pending together).
  for (const auto& [l, lc] : c.layers()) max_incomplete_bytes += lc.bytes;
  CHECK(s.stats().peak_buffered_bytes <= max_incomplete_bytes);
  CHECK(s.stats().buffered_bytes == 0);
}

TEST_CASE("peak buffered memory is bounded by the layers still incomplete", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  // Non-layer tensors first, then layer by layer: at most one layer is ever buffered.
  std::vector<std::string> order;
  for (const auto& n : tensor_names())
    if (layer_grouping().layer_of(n) == non_layer) order.push_back(n);
  for (const auto& n : tensor_names())
    if (layer_grouping().layer_of(n) != non_layer) order.push_back(n);
  for (const auto& n : order) s.push(n, format::dtype::U8, shape_of(n), bytes_of(n, 1));
  s.finish();
  std::uint64_t largest = 0;
  std::uint64_t total = 0;
  for (const auto& [l, lc] : c.layers()) {
    largest = std::max(largest, lc.bytes);
    total += lc.bytes;
  }
  INFO("peak " << s.stats().peak_buffered_bytes << ", largest layer " << largest << ", model " << total);
  CHECK(s.stats().peak_buffered_bytes == largest);
  CHECK(s.stats().peak_buffered_bytes < total / 2);
  CHECK(s.stats().buffered_bytes == 0);

  // Through the pipeline in file order the non-layer group (embedding first,
  // norm and head last) stays pending: peak = that group's first tensor + one layer.
  temp_dir dir;
  write_model(dir.path(), 2);
  const auto ck = checkpoint::open(dir.path());
  reload_session s2(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  load(ck, s2);
  const auto embed = ck.find("model.embed_tokens.weight")->size;
  std::uint64_t largest_layer = 0;
  for (const auto& [l, lc] : c.layers())
    if (l != non_layer) largest_layer = std::max(largest_layer, lc.bytes);
  CHECK(s2.stats().peak_buffered_bytes <= embed + largest_layer + ck.find("model.norm.weight")->size);
  CHECK(s2.stats().peak_buffered_bytes < ck.tensor_bytes() / 2);
}

TEST_CASE("a loader returning void that is offered an out-of-contract application errors before writing",
          "[manifest][reload]") {
  // Initial load by a loader that cannot decline.
  temp_dir dir;
  write_model(dir.path(), 0, [](const std::string& n) { return !n.starts_with("lm_head"); });
  auto c = [&] {
    recorder rec([](tensor_view) {});
    load(checkpoint::open(dir.path()), rec);
    return rec.freeze();
  }();
  std::vector<std::string> writes;
  auto loader = [&writes](tensor_view v) { writes.push_back(v.name()); };
  STATIC_REQUIRE_FALSE(reload_session<decltype(loader)>::can_decline);

  SECTION("pushed") {
    reload_session s(c, loader);
    CHECK_THROWS_AS(s.push("lm_head.weight", format::dtype::U8, {vocab, hidden}, bytes_of("lm_head.weight", 1)),
                    contract_error);
    CHECK(writes.empty());
    CHECK(s.stats().buffered_bytes == 0);
  }
  SECTION("through load(), as the first tensor of the update") {
    temp_dir up;
    sluice::format::writer w;
    w.add("lm_head.weight", format::dtype::U8, {vocab, hidden}, bytes_of("lm_head.weight", 1));
    w.add("model.norm.weight", format::dtype::U8, {hidden}, bytes_of("model.norm.weight", 1));
    w.write(up.path() / "model.safetensors");
    reload_session s(c, loader);
    try {
      (void)load(checkpoint::open(up.path()), s);
      FAIL("the out-of-contract tensor was not refused");
    } catch (const contract_error& err) {
      CHECK(std::string(err.what()).find("'lm_head.weight' is not in the contract and the loader cannot decline it") !=
            std::string::npos);
      CHECK(err.tensor() == "lm_head.weight");
    }
    CHECK(writes.empty());
  }
}

TEST_CASE("a reload session keeps no lease of the views it is given", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  reload_session s(c, engine_loader{&e}, no_publish_hook{}, reload_options{[](const std::string&) {}, true});
  const auto* t_name = "model.layers.0.input_layernorm.weight";
  tensor_ref t{t_name, t_name, 0, format::dtype::U8, {hidden}, 0, hidden};
  auto slot = lease::allocate(hidden);
  const auto src = bytes_of(t_name, 1);
  std::memcpy(slot.bytes().data(), src.data(), hidden);
  tensor_view v;
  v.tensor = &t;
  v.bytes = slot.bytes().first(4);
  v.hold = slot;
  CHECK(s.accept(std::move(v)));
  CHECK(slot.use_count() == 1);
  tensor_view v2;
  v2.tensor = &t;
  v2.offset = 4;
  v2.bytes = slot.bytes().subspan(4);
  v2.hold = slot;
  CHECK(s.accept(std::move(v2)));
  CHECK(slot.use_count() == 1);
  CHECK(s.stats().buffered_bytes == hidden);
  CHECK_THROWS_AS(s.finish(), contract_error);
  CHECK(s.stats().buffered_bytes == 0);
}

TEST_CASE("a session takes the next update after finish", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  for (int gen = 1; gen <= 2; ++gen) {
    for (const auto& n : tensor_names()) s.push(n, format::dtype::U8, shape_of(n), bytes_of(n, gen));
    s.finish();
  }
  CHECK(o.published.size() == 2 * (n_layers + 1));
  CHECK(e.buffers.at("model.norm.weight") == bytes_of("model.norm.weight", 2));
  CHECK(o.warnings.empty());
}
