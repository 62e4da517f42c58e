#pragma once
// A small MoE-like checkpoint and an engine-like weight loader for the
// manifest tests: fused q/k/v (shard_id selectors), routed experts
// (expert_id selectors, an EP rank declines the experts it does not own), a
// vocab-padded embedding and a derived buffer the engine computes itself.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <sluice/format/writer.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/tensor_view.hpp>

#include "support/temp_dir.hpp"

namespace manifest_test {

using sluice_test::temp_dir;

inline constexpr int n_layers = 3;
inline constexpr int n_experts = 4;
inline constexpr std::uint64_t vocab = 10;
inline constexpr std::uint64_t hidden = 8;

/// Each tensor's bytes: a pattern derived from its name and a generation.
inline std::byte pattern(const std::string& name, std::uint64_t i, int generation) {
  return static_cast<std::byte>((std::hash<std::string>{}(name) + i * 7 + static_cast<std::uint64_t>(generation) * 13) & 0xff);
}

/// Names of the model's tensors, in file order.
inline std::vector<std::string> tensor_names() {
  std::vector<std::string> n{"model.embed_tokens.weight"};
  for (int l = 0; l < n_layers; ++l) {
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) n.push_back(fmt::format("model.layers.{}.self_attn.{}.weight", l, p));
    for (int e = 0; e < n_experts; ++e) n.push_back(fmt::format("model.layers.{}.mlp.experts.{}.w1.weight", l, e));
    n.push_back(fmt::format("model.layers.{}.input_layernorm.weight", l));
  }
  n.push_back("model.norm.weight");
  n.push_back("lm_head.weight");
  return n;
}

inline std::vector<std::uint64_t> shape_of(const std::string& name) {
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return {vocab, hidden};
  if (name.ends_with("norm.weight")) return {hidden};
  return {hidden, hidden};
}

/// Writes the model (generation `gen`) into `dir/model.safetensors`, keeping
/// the tensors for which `keep(name)` is true.
template <class Keep>
void write_model(const std::filesystem::path& dir, int gen, Keep keep, const std::string& file = "model.safetensors") {
  sluice::format::writer w;
  for (const auto& name : tensor_names()) {
    if (!keep(name)) continue;
    const auto shape = shape_of(name);
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<std::byte> bytes(n);  // U8
    for (std::uint64_t i = 0; i < n; ++i) bytes[i] = pattern(name, i, gen);
    w.add(name, sluice::format::dtype::U8, shape, bytes);
  }
  w.write(dir / file);
}
inline void write_model(const std::filesystem::path& dir, int gen = 0) {
  write_model(dir, gen, [](const std::string&) { return true; });
}

/// An engine-like weight loader. Destinations are the engine's buffers; the
/// embedding's is padded to 16 rows (vocab 10); `model.layers.N.rotary_cache`
/// is a derived buffer the engine computes itself (never an application).
struct engine {
  int ep_rank = 0;
  int ep_size = 1;
  std::map<std::string, std::vector<std::byte>> buffers;
  std::vector<std::string> writes;  ///< "destination" per write, in order

  engine() {
    buffers["model.embed_tokens.weight"].resize(16 * hidden);  // padded rows
    for (int l = 0; l < n_layers; ++l) {
      buffers[fmt::format("model.layers.{}.self_attn.qkv_proj.weight", l)].resize(3 * hidden * hidden);
      buffers[fmt::format("model.layers.{}.mlp.experts.w1", l)].resize(n_experts * hidden * hidden);
      buffers[fmt::format("model.layers.{}.rotary_cache", l)].resize(hidden);  // derived
    }
  }
  [[nodiscard]] bool owns(int expert) const { return expert % ep_size == ep_rank; }

  /// The loader: bool(view, log). Declines non-owned experts.
  bool load(sluice::tensor_view v, sluice::manifest::application_log& log) {
    static const std::regex qkv(R"(model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight)");
    static const std::regex expert(R"(model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.w1\.weight)");
    const std::string& name = v.name();
    std::smatch m;
    std::string dst = name;
    std::uint64_t at = 0;
    sluice::manifest::selectors sel;
    if (std::regex_match(name, m, qkv)) {
      dst = fmt::format("model.layers.{}.self_attn.qkv_proj.weight", m[1].str());
      const char s = m[2].str()[0];
      at = static_cast<std::uint64_t>(s == 'q' ? 0 : s == 'k' ? 1 : 2) * hidden * hidden;
      sel.emplace("shard_id", std::string(1, s));
    } else if (std::regex_match(name, m, expert)) {
      const int e = std::stoi(m[2].str());
      if (!owns(e)) return false;
      dst = fmt::format("model.layers.{}.mlp.experts.w1", m[1].str());
      at = static_cast<std::uint64_t>(e) * hidden * hidden;
      sel.emplace("expert_id", std::int64_t{e});
    }
    if (v.kind != sluice::view_kind::metadata) {  // a probe: record only, write nothing
      auto& buf = buffers[dst];
      if (buf.size() < at + v.bytes.size()) buf.resize(at + v.bytes.size());
      std::memcpy(buf.data() + at, v.bytes.data(), v.bytes.size());
      writes.push_back(dst);
      if (name.starts_with("model.layers.") && name.ends_with("input_layernorm.weight")) {
        // recompute the derived buffer (not an application)
        auto l = name.substr(13, name.find('.', 13) - 13);
        buffers[fmt::format("model.layers.{}.rotary_cache", l)].assign(hidden, std::byte{1});
      }
    }
    log.record(dst, std::move(sel));
    return true;
  }
};

/// A callable wrapper around engine::load (keeps the engine by reference).
struct engine_loader {
  engine* e;
  bool operator()(sluice::tensor_view v, sluice::manifest::application_log& log) { return e->load(std::move(v), log); }
};

}  // namespace manifest_test
