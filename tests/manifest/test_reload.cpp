// Tests of include/sluice/manifest/reload.hpp: layerwise reload against a
// recorded contract.

#include <utility>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/load_file.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/manifest/reload.hpp>
#include <sluice/testing/reload_meter.hpp>

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

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

/// The engine's loader, declining the tensor named `decline` (a reload whose
/// loader drops a contract tensor).
struct declining_loader {
  engine* e;
  std::string decline;
  bool operator()(tensor_view v, application_log& log) { return v.name() != decline && e->load(std::move(v), log); }
};

/// A contract recorded from `dir` by a loader that cannot decline.
contract initial_load_void(const std::filesystem::path& dir) {
  recorder rec([](tensor_view) {});
  load(checkpoint::open(dir), rec);
  return rec.freeze();
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

  // The bound the design promises: the bytes of the layers still incomplete.
  // Replay the arrival order against the contract to know it after every push
  // (here each source's keys lie in the layer of its own name).
  std::map<std::int64_t, std::set<std::string>> waiting;
  for (const auto& [l, lc] : c.layers()) waiting[l] = lc.sources();
  std::map<std::int64_t, std::uint64_t> pending_bytes;
  std::uint64_t incomplete_bytes = 0;
  std::uint64_t expected_peak = 0;
  const auto push = [&](const std::string& n) {
    const auto bytes = bytes_of(n, 1);
    s.push(n, format::dtype::U8, shape_of(n), bytes);
    const auto l = layer_grouping().layer_of(n);
    pending_bytes[l] += bytes.size();
    incomplete_bytes += bytes.size();
    expected_peak = std::max(expected_peak, incomplete_bytes);
    waiting.at(l).erase(n);
    if (waiting.at(l).empty()) incomplete_bytes -= std::exchange(pending_bytes[l], 0);
    INFO("after " << n);
    CHECK(s.stats().buffered_bytes == incomplete_bytes);
  };
  for (std::size_t i = 0; i < per_layer[0].size(); ++i)
    for (int l = n_layers - 1; l >= 0; --l)
      if (i < per_layer[static_cast<std::size_t>(l)].size()) push(per_layer[static_cast<std::size_t>(l)][i]);
  for (const auto& n : others) push(n);
  CHECK(o.published == std::vector<std::int64_t>{1, 0, non_layer});  // layer 1's last tensor comes before layer 0's
  CHECK_FALSE(s.published(2));
  push(held);
  CHECK(o.published == std::vector<std::int64_t>{1, 0, non_layer, 2});
  s.finish();

  // The peak comes when layer 1's norm (its last tensor) arrives: all three
  // layers are pending at once, layers 0 and 2 without their norms.
  std::uint64_t model_bytes = 0;
  for (const auto& [l, lc] : c.layers()) model_bytes += lc.bytes;
  const auto layer_bytes = c.layer(0)->bytes;
  INFO("peak " << s.stats().peak_buffered_bytes << ", expected " << expected_peak << ", model " << model_bytes);
  CHECK(expected_peak == 3 * layer_bytes - 2 * hidden);
  CHECK(s.stats().peak_buffered_bytes == expected_peak);
  CHECK(s.stats().peak_buffered_bytes < model_bytes);
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

TEST_CASE("an EP rank offered every expert buffers none it declines: within its share of the incomplete layers",
          "[manifest][reload][memory]") {
  // EP rank 1 of 4 keeps one expert of four per layer. The update offers
  // every expert (a whole checkpoint read by this rank, as an RL trainer
  // would send it); the three others must be declined as they arrive, never
  // buffered until their layer publishes.
  engine e;
  e.ep_rank = 1;
  e.ep_size = 4;
  const auto c = initial_load(e);
  temp_dir dir;
  write_model(dir.path(), 1);
  const auto ck = checkpoint::open(dir.path());
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  testing::reload_meter meter(s);
  load_options opt;
  opt.max_read = 16;  // pieces: the buffer of a tensor is made at its first
  opt.staging_budget = 4 * slot_size_for(16);
  (void)load(ck, meter, opt);
  CHECK(o.published.size() == n_layers + 1);
  CHECK(o.warnings.empty());  // declined as in the initial load: silently
  CHECK(s.stats().declined == n_layers * (n_experts - 1));
  CHECK(s.stats().buffered_bytes == 0);
  INFO("peak " << s.stats().peak_buffered_bytes << ", share at peak " << meter.share_at_peak() << ", excess "
               << meter.max_excess() << ", contract " << c.bytes());
  CHECK(meter.max_excess() == 0);
  CHECK(meter.seen_peak() == s.stats().peak_buffered_bytes);  // the meter saw the session's peak
  CHECK(s.stats().peak_buffered_bytes <= meter.share_at_peak());
  // The non-owned experts were never copied: the new bytes reached only the owned one.
  const auto& w1 = e.buffers.at("model.layers.2.mlp.experts.w1");
  CHECK(w1[1 * hidden * hidden + 7] == pattern("model.layers.2.mlp.experts.1.w1.weight", 7, 1));
  CHECK(w1[2 * hidden * hidden + 7] == std::byte{0});
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

TEST_CASE("a layer whose loader did not re-apply a contract key is never published", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  const std::string declined = "model.layers.1.self_attn.k_proj.weight";
  const application_key key{declined, "model.layers.1.self_attn.qkv_proj.weight", {{"shard_id", std::string("k")}}};
  observer o;
  reload_session s(c, declining_loader{&e, declined}, publish_hook{&o}, quiet(o));
  STATIC_REQUIRE(decltype(s)::can_decline);
  std::vector<std::string> errors;
  for (const auto& n : tensor_names()) {
    try {
      s.push(n, format::dtype::U8, shape_of(n), bytes_of(n, 1));
    } catch (const contract_error& err) {
      errors.push_back(err.what());
    }
  }
  REQUIRE(errors.size() == 1);  // raised by layer 1's last tensor
  INFO(errors.front());
  CHECK(contains(errors.front(), "layer 1 was not published"));
  CHECK(contains(errors.front(), "did not re-apply 1 contract key"));
  CHECK(contains(errors.front(), to_string(key)));
  // The publish hook never ran for layer 1; the other layers were published.
  CHECK(o.published == std::vector<std::int64_t>{0, 2, non_layer});
  CHECK_FALSE(s.published(1));
  CHECK(s.stats().layers_published == n_layers);
  CHECK(s.missing().at(1) == std::vector<application_key>{key});

  SECTION("finish() reports it as incomplete") {
    try {
      s.finish();
      FAIL("finish() accepted a layer whose publish was refused");
    } catch (const contract_error& err) {
      CHECK(contains(err.what(), "layer 1 is missing 1 key [" + to_string(key) + "]"));
    }
    REQUIRE(s.last_incomplete().size() == 1);
    CHECK(s.last_incomplete().at(1) == std::vector<application_key>{key});
    CHECK(s.stats().buffered_bytes == 0);
    CHECK(o.published == std::vector<std::int64_t>{0, 2, non_layer});
  }
  SECTION("a later copy of the tensor, applied, publishes the layer") {
    s.loader().decline.clear();
    s.push(declined, format::dtype::U8, shape_of(declined), bytes_of(declined, 2));
    CHECK(o.published == std::vector<std::int64_t>{0, 2, non_layer, 1});
    CHECK_NOTHROW(s.finish());
    CHECK(e.buffers.at("model.layers.1.self_attn.qkv_proj.weight")[hidden * hidden + 1] == pattern(declined, 1, 2));
    CHECK(s.stats().buffered_bytes == 0);
  }
}

TEST_CASE("a reload from a checkpoint refuses tensors a void loader cannot decline before reading any",
          "[manifest][reload]") {
  temp_dir dir;
  write_model(dir.path(), 0, [](const std::string& n) { return !n.starts_with("lm_head"); });
  const auto c = initial_load_void(dir.path());
  std::vector<std::string> writes;
  auto loader = [&writes](tensor_view v) { writes.push_back(v.name()); };
  observer o;
  reload_session s(c, loader, publish_hook{&o}, quiet(o));
  STATIC_REQUIRE_FALSE(decltype(s)::can_decline);
  load_progress progress;
  load_options opt;
  opt.progress = &progress;

  // The whole model in file order, then the tensors outside the contract last:
  // every layer would be complete (and published) before they arrive.
  const std::string extra = "model.layers.1.mlp.extra_bias";
  temp_dir up;
  const auto file = up.path() / "model.safetensors";
  const auto write_update = [&](bool with_extra) {
    sluice::format::writer w;
    for (const auto& n : tensor_names())
      if (n != "lm_head.weight") w.add(n, format::dtype::U8, shape_of(n), bytes_of(n, 1));
    if (with_extra) w.add(extra, format::dtype::U8, {4}, std::vector<std::byte>(4, std::byte{9}));
    w.add("lm_head.weight", format::dtype::U8, shape_of("lm_head.weight"), bytes_of("lm_head.weight", 1));
    w.write(file);
  };

  SECTION("every offending tensor is named with its file") {
    write_update(true);
    const auto ck = checkpoint::open(up.path());
    REQUIRE(ck.tensors().back().name == "lm_head.weight");
    try {
      (void)s.reload(ck, opt);
      FAIL("the out-of-contract tensors were not refused");
    } catch (const contract_error& err) {
      INFO(err.what());
      CHECK(contains(err.what(), "2 tensors that are not in the contract and the loader cannot decline them"));
      CHECK(contains(err.what(), "nothing was read or written"));
      CHECK(contains(err.what(), fmt::format("tensor '{}' in file '{}'", extra, file.string())));
      CHECK(contains(err.what(), fmt::format("tensor 'lm_head.weight' in file '{}'", file.string())));
    }
  }
  SECTION("a single offending tensor is the error's tensor and file") {
    write_update(false);
    const auto ck = checkpoint::open(up.path());
    REQUIRE(ck.tensors().back().name == "lm_head.weight");
    try {
      (void)s.reload(ck, opt);
      FAIL("the out-of-contract tensor was not refused");
    } catch (const contract_error& err) {
      CHECK(err.tensor() == "lm_head.weight");
      CHECK(err.file() == file.string());
      CHECK(contains(err.what(), "not in the contract and the loader cannot decline it"));
    }
  }
  // Nothing was read, offered to the loader, buffered or published.
  CHECK(progress.total_tensors.load() == 0);  // load() never started
  CHECK(progress.bytes_done.load() == 0);
  CHECK(writes.empty());
  CHECK(o.published.empty());
  CHECK(s.stats().tensors == 0);
  CHECK(s.stats().peak_buffered_bytes == 0);
}

TEST_CASE("a reload from a checkpoint within the contract loads and publishes it", "[manifest][reload]") {
  temp_dir dir;
  write_model(dir.path(), 0);
  const auto c = initial_load_void(dir.path());
  std::map<std::string, std::vector<std::byte>> written;
  auto loader = [&written](tensor_view v) { written[v.name()].assign(v.bytes.begin(), v.bytes.end()); };
  observer o;
  reload_session s(c, loader, publish_hook{&o}, quiet(o));
  CHECK_NOTHROW(s.check_update(checkpoint::open(dir.path())));
  temp_dir up;
  write_model(up.path(), 1);
  const auto st = s.reload(checkpoint::open(up.path()));
  CHECK(st.tensors == tensor_names().size());
  CHECK(o.published.size() == n_layers + 1);
  CHECK(written.at("lm_head.weight") == bytes_of("lm_head.weight", 1));
  CHECK(s.last_incomplete().empty());  // load() ran finish()

  // A loader that can decline has nothing to check up front.
  reload_session d(c, [](tensor_view) { return false; });
  sluice::format::writer w;
  w.add("not.in.the.contract", format::dtype::U8, {1}, std::vector<std::byte>(1));
  temp_dir other;
  w.write(other.path() / "model.safetensors");
  CHECK_NOTHROW(d.check_update(checkpoint::open(other.path())));
}

TEST_CASE("a plain load() into a session checks a void loader's tensors one at a time", "[manifest][reload]") {
  // The documented limit of driving the session as a plain sink: a tensor
  // outside the contract is refused on its first piece, after the layers the
  // update completed before it were published. reload() checks up front.
  temp_dir dir;
  write_model(dir.path(), 0, [](const std::string& n) { return !n.starts_with("lm_head"); });
  const auto c = initial_load_void(dir.path());
  std::vector<std::string> writes;
  auto loader = [&writes](tensor_view v) { writes.push_back(v.name()); };
  observer o;
  reload_session s(c, loader, publish_hook{&o}, quiet(o));
  temp_dir up;
  write_model(up.path(), 1);  // lm_head.weight is the last tensor
  try {
    (void)load(checkpoint::open(up.path()), s);
    FAIL("the out-of-contract tensor was not refused");
  } catch (const contract_error& err) {
    CHECK(err.tensor() == "lm_head.weight");
  }
  CHECK(std::count(writes.begin(), writes.end(), "lm_head.weight") == 0);
  CHECK(o.published.size() == n_layers + 1);  // every group was complete before it
}

TEST_CASE("a source tensor counts towards the layer of its destination", "[manifest][reload]") {
  // The loader puts `blk3.x` into layer 5; the pattern would put its source name in layer 3.
  auto loader = [](tensor_view v, application_log& log) {
    log.record(v.name() == "blk3.x" ? "model.layers.5.y" : v.name());
    return true;
  };
  const std::string pattern_both = R"((?:blk|layers\.)(\d+)\.)";
  tensor_ref a{"blk3.x", "blk3.x", 0, format::dtype::U8, {4}, 0, 4};
  tensor_ref b{"model.layers.5.z", "model.layers.5.z", 0, format::dtype::U8, {4}, 4, 4};
  recorder rec(loader, {pattern_both});
  for (const auto* t : {&a, &b}) {
    tensor_view v;
    v.tensor = t;
    v.kind = view_kind::metadata;
    REQUIRE(rec.accept(std::move(v)));
  }
  const auto c = rec.freeze();
  REQUIRE(c.layer(5) != nullptr);
  CHECK(c.layer(3) == nullptr);

  observer o;
  reload_session s(c, loader, publish_hook{&o}, quiet(o));
  s.push("blk3.x", format::dtype::U8, {4}, std::vector<std::byte>(4, std::byte{1}));
  CHECK(o.published.empty());  // layer 5 still waits for model.layers.5.z
  CHECK(s.missing().at(5) == std::vector<application_key>{{"model.layers.5.z", "model.layers.5.z", {}}});
  s.push("model.layers.5.z", format::dtype::U8, {4}, std::vector<std::byte>(4, std::byte{2}));
  CHECK(o.published == std::vector<std::int64_t>{5});
  CHECK_NOTHROW(s.finish());
  CHECK(o.warnings.empty());  // blk3.x was no extra: its key is layer 5's
}

TEST_CASE("a tensor whose pieces do not add up to its size is refused at its last piece", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  const std::string name = "model.layers.0.input_layernorm.weight";
  // Every other tensor of layer 0 first: this one completes the layer.
  for (const auto& src : c.layer(0)->sources())
    if (src != name) s.push(src, format::dtype::U8, shape_of(src), bytes_of(src, 1));
  const auto buffered = s.stats().buffered_bytes;
  tensor_ref t{name, name, 0, format::dtype::U8, {hidden}, 0, hidden};
  const auto src = bytes_of(name, 1);
  const auto piece = [&](std::uint64_t offset, std::size_t n) {
    tensor_view v;
    v.tensor = &t;
    v.offset = offset;
    v.bytes = std::span<const std::byte>(src).subspan(offset, n);
    return v;
  };
  std::string message;
  SECTION("short: a piece is missing") {
    CHECK(s.accept(piece(0, 2)));
    try {
      s.accept(piece(4, 4));  // bytes [2, 4) never came
    } catch (const contract_error& err) {
      message = err.what();
      CHECK(err.tensor() == name);
    }
    INFO(message);
    CHECK(contains(message, "held 6 bytes at its last piece, but the tensor has 8 (a piece is missing)"));
  }
  SECTION("overlong: pieces overlap") {
    CHECK(s.accept(piece(0, 6)));
    try {
      s.accept(piece(4, 4));
    } catch (const contract_error& err) {
      message = err.what();
      CHECK(err.tensor() == name);
    }
    INFO(message);
    CHECK(contains(message, "held 10 bytes at its last piece, but the tensor has 8 (pieces overlap)"));
  }
  CHECK(contains(message, "tensor '" + name + "'"));
  CHECK(o.published.empty());  // the layer was not completed by it
  CHECK(s.stats().buffered_bytes == buffered);  // its buffer was freed
  // The whole tensor afterwards completes the layer.
  s.push(name, format::dtype::U8, {hidden}, src);
  CHECK(o.published == std::vector<std::int64_t>{0});
}

TEST_CASE("a shared view is kept, not copied, and published as the same shared view", "[manifest][reload][memory]") {
  // A distributed load's shared table: every local rank gets a view of the
  // node's one copy. Copying it would make each rank hold its own.
  engine e;
  const auto c = initial_load(e);
  observer o;
  const std::string name = "model.layers.0.input_layernorm.weight";
  std::vector<std::pair<view_kind, const std::byte*>> seen;
  auto loader = [&](tensor_view v, application_log& log) {
    if (v.name() == name && v.carries_data()) seen.emplace_back(v.kind, v.bytes.data());
    return e.load(std::move(v), log);
  };
  reload_session s(c, loader, publish_hook{&o}, quiet(o));
  tensor_ref t{name, name, 0, format::dtype::U8, {hidden}, 0, hidden};
  auto segment = lease::allocate(4 * hidden);  // stands for the node's segment
  const auto src = bytes_of(name, 1);
  std::memcpy(segment.bytes().data() + hidden, src.data(), hidden);
  tensor_view v;
  v.tensor = &t;
  v.kind = view_kind::shared;
  v.host_destined = true;
  v.bytes = segment.bytes().subspan(hidden, hidden);
  v.hold = segment;
  CHECK(s.accept(std::move(v)));
  CHECK(s.stats().buffered_bytes == 0);  // nothing copied
  CHECK(s.stats().peak_buffered_bytes == 0);
  CHECK(o.published.empty());
  for (const auto& other : c.layer(0)->sources())
    if (other != name) s.push(other, format::dtype::U8, shape_of(other), bytes_of(other, 1));
  CHECK(o.published == std::vector<std::int64_t>{0});
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].first == view_kind::shared);
  CHECK(seen[0].second == segment.bytes().data() + hidden);  // the segment's bytes themselves
  CHECK(e.buffers.at(name) == src);
  CHECK(s.stats().buffered_bytes == 0);
}

TEST_CASE("a TP part is buffered as its part's bytes and published as that part", "[manifest][reload]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  const std::string name = "model.layers.0.input_layernorm.weight";
  std::vector<tensor_part> seen;
  auto loader = [&](tensor_view v, application_log& log) {
    if (v.name() == name) seen.push_back(v.part);
    return e.load(std::move(v), log);
  };
  reload_session s(c, loader, publish_hook{&o}, quiet(o));
  tensor_ref t{name, name, 0, format::dtype::U8, {hidden}, 0, hidden};
  const auto src = bytes_of(name, 1);
  tensor_view v;  // TP rank 1 of 2 keeps the second half of the rows
  v.tensor = &t;
  v.part = {0, 1, 2};
  v.bytes = std::span<const std::byte>(src).subspan(hidden / 2, hidden / 2);
  CHECK(v.last());
  CHECK(s.accept(std::move(v)));
  CHECK(s.stats().buffered_bytes == hidden / 2);  // the part, not the whole tensor
  CHECK(o.published.empty());
  for (const auto& other : c.layer(0)->sources())
    if (other != name) s.push(other, format::dtype::U8, shape_of(other), bytes_of(other, 1));
  CHECK(o.published == std::vector<std::int64_t>{0});
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == tensor_part{0, 1, 2});
}

// Who ends an update: load() calls the session's finish(); an engine that ends
// the update itself as well (vLLM's finish_weight_update) ends an empty one.

TEST_CASE("finish() after load() ended a complete update is a no-op that keeps its result", "[manifest][reload][finish]") {
  engine e;
  e.ep_rank = 1;
  e.ep_size = 2;
  const auto c = initial_load(e);
  temp_dir dir;
  write_model(dir.path(), 1);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  (void)load(checkpoint::open(dir.path()), s);
  REQUIRE(o.published.size() == n_layers + 1);
  bool ended = true;
  CHECK_NOTHROW(ended = s.finish());  // the engine's own end of the update
  CHECK_FALSE(ended);
  CHECK(s.last_incomplete().empty());
  CHECK(o.published.size() == n_layers + 1);
  CHECK(s.stats().updates == 1);
  CHECK(s.stats().layers_published == n_layers + 1);
  CHECK(o.warnings.empty());
}

TEST_CASE("an update missing one tensor names it, leaves only its layer unpublished, and a later finish() keeps the report",
          "[manifest][reload][finish]") {
  engine e;
  const auto c = initial_load(e);
  const std::string missing = "model.layers.2.mlp.experts.1.w1.weight";
  const application_key key{missing, "model.layers.2.mlp.experts.w1", {{"expert_id", std::int64_t{1}}}};
  temp_dir dir;
  write_model(dir.path(), 1, [&](const std::string& n) { return n != missing; });
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  std::string message;
  try {
    (void)load(checkpoint::open(dir.path()), s);
  } catch (const contract_error& err) {
    message = err.what();
  }
  INFO(message);
  CHECK(contains(message, "1 layer did not meet its contract"));
  CHECK(contains(message, "layer 2 is missing 1 key [" + to_string(key) + "]"));
  CHECK(o.published == std::vector<std::int64_t>{0, 1, non_layer});
  CHECK_FALSE(s.published(2));

  bool ended = true;
  CHECK_NOTHROW(ended = s.finish());  // an empty update: the failed one stays the last result
  CHECK_FALSE(ended);
  REQUIRE(s.last_incomplete().size() == 1);
  CHECK(s.last_incomplete().at(2) == std::vector<application_key>{key});
  CHECK(s.stats().updates == 1);
  CHECK(s.stats().buffered_bytes == 0);
}

TEST_CASE("two updates through load() in a row on one session, each ended twice", "[manifest][reload][finish]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));
  for (int gen = 1; gen <= 2; ++gen) {
    temp_dir dir;
    write_model(dir.path(), gen);
    (void)load(checkpoint::open(dir.path()), s);
    CHECK_FALSE(s.finish());
    CHECK(o.published.size() == static_cast<std::size_t>(gen) * (n_layers + 1));
    CHECK(e.buffers.at("model.norm.weight") == bytes_of("model.norm.weight", gen));
  }
  CHECK(s.stats().updates == 2);
  CHECK(s.last_incomplete().empty());
  CHECK(o.warnings.empty());
}

TEST_CASE("an empty update claims nothing is missing, an update of placeholders is a real one", "[manifest][reload][finish]") {
  engine e;
  const auto c = initial_load(e);
  observer o;
  reload_session s(c, engine_loader{&e}, publish_hook{&o}, quiet(o));  // every layer required
  bool ended = true;
  CHECK_NOTHROW(ended = s.finish());
  CHECK_FALSE(ended);
  CHECK(s.last_incomplete().empty());
  CHECK(o.published.empty());
  CHECK(s.stats().updates == 0);

  // A placeholder (a tensor another rank owns) makes the update real: its
  // layers are missing and finish() says so.
  const std::string name = "model.layers.0.input_layernorm.weight";
  tensor_ref t{name, name, 0, format::dtype::U8, {hidden}, 0, hidden};
  tensor_view v;
  v.tensor = &t;
  v.kind = view_kind::metadata;
  CHECK_FALSE(s.accept(std::move(v)));
  CHECK_THROWS_AS(s.finish(), contract_error);
  CHECK(s.last_incomplete().size() == n_layers + 1);
  CHECK(s.stats().updates == 1);
}
