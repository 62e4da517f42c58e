#pragma once
/// \file
/// Deterministic DeepSeek-like test checkpoints (for tests, benchmarks and the
/// gen-checkpoint tool).
///
/// A checkpoint is planned first (tensor list, shard assignment, offsets,
/// header and index JSON: `make_layout`), then optionally written
/// (`write_checkpoint`). Every tensor's bytes are a pure function of
/// (seed, tensor name, byte offset): word w (8 bytes, little-endian) of tensor
/// `name` is `splitmix64_mix(key + (w + 1) * 0x9e3779b97f4a7c15)` with
/// `key = splitmix64_mix(seed ^ fnv1a64(name))`, so a test (or a Python
/// one-liner) recomputes any byte range independently, and writing runs at
/// memory speed.
///
/// Layout (names as DeepSeek-V3 writes them; `model.` becomes
/// `model.language_model.` with `vl_prefix`):
/// - ordinary shards: `model.embed_tokens.weight`; per layer the attention
///   (`self_attn.{q,k,v,o}_proj.weight`) and norms (BF16); the first
///   `dense_layers` layers a dense MLP (`mlp.{gate,up,down}_proj.weight`, BF16),
///   the others a router (`mlp.gate.weight`), shared experts
///   (`mlp.shared_experts.{gate,up,down}_proj.weight`, BF16) and routed experts
///   (`mlp.experts.{E}.{gate,up,down}_proj.weight` F8_E4M3 with
///   `...weight_scale_inv` F32, one scale per 128x128 block); `model.norm.weight`,
///   `lm_head.weight`; odd tensors (scalar, zero-size, BOOL, I64);
/// - one shard per Engram-like table: `model.engram.{i}.table` (F8_E4M3
///   [rows, dim]) and `model.engram.{i}.scale` (F32 [rows, ceil(dim/128)]), with
///   two small ordinary tensors (`model.engram.{i}.norm.weight`,
///   `model.engram.{i}.gate.weight`, BF16);
/// - the draft (MTP) module, layer index `layers`, in three shards of its own.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/error.hpp>
#include <sluice/format/dtype.hpp>
#include <sluice/format/index.hpp>
#include <sluice/format/writer.hpp>

namespace sluice::inline v0::testing {

/// What a generated tensor is (for tests and policies that need ground truth).
enum class tensor_role : std::uint8_t {
  embedding,      ///< embed_tokens, lm_head
  norm,           ///< layer norms
  attention,      ///< self_attn projections
  dense_mlp,      ///< dense-layer MLP
  router,         ///< mlp.gate (MoE router)
  shared_expert,  ///< mlp.shared_experts.*
  routed_expert,  ///< mlp.experts.{E}.*_proj.weight (F8_E4M3)
  expert_scale,   ///< mlp.experts.{E}.*_proj.weight_scale_inv (F32)
  engram_table,   ///< model.engram.{i}.table / .scale (shared host tables)
  engram_small,   ///< the small ordinary tensors next to an Engram table
  draft,          ///< the draft / MTP module
  odd,            ///< scalar, zero-size, BOOL, I64 tensors
};

/// The role's name, e.g. "routed_expert".
[[nodiscard]] constexpr std::string_view role_name(tensor_role r) noexcept {
  constexpr std::string_view names[] = {"embedding", "norm",          "attention",     "dense_mlp",
                                        "router",    "shared_expert", "routed_expert", "expert_scale",
                                        "engram_table", "engram_small", "draft",       "odd"};
  return names[static_cast<std::size_t>(r)];
}

/// Shape parameters of a generated checkpoint. Defaults give a ~1 MiB checkpoint.
struct generator_options {
  std::uint32_t layers = 3;            ///< decoder layers (the draft module is layer `layers`)
  std::uint32_t dense_layers = 1;      ///< the first layers use a dense MLP, the rest MoE
  std::uint32_t experts = 4;           ///< routed experts per MoE layer
  std::uint32_t shared_experts = 1;    ///< shared experts are one fused MLP of this many times moe_intermediate
  std::uint64_t hidden = 64;           ///< model width
  std::uint64_t intermediate = 128;    ///< dense MLP width
  std::uint64_t moe_intermediate = 32; ///< routed expert width
  std::uint64_t vocab = 256;
  std::uint32_t engram_tables = 2;     ///< Engram-like tables, one shard each
  std::uint64_t engram_rows = 1024;
  std::uint64_t engram_dim = 128;
  bool draft = true;                   ///< write the draft (MTP) module in three shards
  bool odd_tensors = true;             ///< scalar, zero-size, BOOL and I64 tensors
  bool vl_prefix = false;              ///< `model.` -> `model.language_model.`
  std::uint64_t seed = 1;
  std::uint64_t max_shard_bytes = 256u << 10;  ///< ordinary shards are cut at about this size
  std::uint64_t alignment = 8;         ///< data section alignment (the writer's)
};

/// One planned tensor.
struct planned_tensor {
  std::string name;
  format::dtype type = format::dtype::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t size = 0;    ///< bytes
  std::uint32_t shard = 0;   ///< index into checkpoint_layout::shards
  std::uint64_t begin = 0;   ///< offset in the shard's data section
  tensor_role role = tensor_role::odd;
};

/// One planned shard file.
struct planned_shard {
  std::string name;                  ///< e.g. model-00001-of-00009.safetensors
  std::vector<std::size_t> tensors;  ///< indices into checkpoint_layout::tensors, in file order
  std::string header_json;           ///< the JSON after the 8-byte length (padded)
  std::uint64_t data_size = 0;

  /// Bytes of the header (length prefix + JSON).
  [[nodiscard]] std::uint64_t header_bytes() const noexcept { return 8 + header_json.size(); }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return header_bytes() + data_size; }
};

/// A whole planned checkpoint: what `write_checkpoint` writes, byte for byte.
struct checkpoint_layout {
  generator_options options;
  std::vector<planned_tensor> tensors;  ///< in file order (shard, then offset)
  std::vector<planned_shard> shards;    ///< in name order
  std::string index_json;               ///< model.safetensors.index.json
  std::uint64_t total_size = 0;         ///< sum of tensor bytes (the index's total_size)

  /// Bytes a header-only open reads: the index plus every shard's header.
  [[nodiscard]] std::uint64_t header_bytes() const noexcept {
    std::uint64_t n = index_json.size();
    for (const auto& s : shards) n += s.header_bytes();
    return n;
  }
  /// Sum of file sizes (index included).
  [[nodiscard]] std::uint64_t file_bytes() const noexcept {
    std::uint64_t n = index_json.size();
    for (const auto& s : shards) n += s.file_size();
    return n;
  }
  /// The tensor named `name`, or nullptr (linear search).
  [[nodiscard]] const planned_tensor* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

// ---- contents ------------------------------------------------------------------

/// splitmix64's output function.
[[nodiscard]] constexpr std::uint64_t splitmix64_mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// FNV-1a, 64 bits.
[[nodiscard]] constexpr std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// The per-tensor key of the content function.
[[nodiscard]] constexpr std::uint64_t content_key(std::uint64_t seed, std::string_view name) noexcept {
  return splitmix64_mix(seed ^ fnv1a64(name));
}

/// Fills `out` with the bytes of tensor `name` starting at byte `offset` of the tensor.
inline void fill_bytes(std::uint64_t seed, std::string_view name, std::uint64_t offset, std::span<std::byte> out) noexcept {
  constexpr std::uint64_t gamma = 0x9e3779b97f4a7c15ull;
  const std::uint64_t key = content_key(seed, name);
  auto word = [key](std::uint64_t w) {
    std::uint64_t v = splitmix64_mix(key + (w + 1) * gamma);
    if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
    return v;
  };
  std::size_t i = 0;
  // Leading partial word.
  while (i < out.size() && (offset + i) % 8 != 0) {
    const std::uint64_t o = offset + i;
    out[i] = static_cast<std::byte>(word(o / 8) >> (8 * (o % 8)));
    ++i;
  }
  // Whole words.
  std::uint64_t w = (offset + i) / 8;
  for (; i + 8 <= out.size(); i += 8, ++w) {
    const std::uint64_t v = word(w);
    std::memcpy(out.data() + i, &v, 8);
  }
  // Trailing partial word.
  if (i < out.size()) {
    const std::uint64_t v = word(w);
    for (unsigned b = 0; i < out.size(); ++i, ++b) out[i] = static_cast<std::byte>(v >> (8 * b));
  }
}

/// The whole content of a tensor (for tests; sizes are small there).
[[nodiscard]] inline std::vector<std::byte> tensor_bytes(std::uint64_t seed, std::string_view name, std::uint64_t size) {
  std::vector<std::byte> v(size);
  fill_bytes(seed, name, 0, v);
  return v;
}

// ---- digests ---------------------------------------------------------------------

/// A small streaming SHA-256 (FIPS 180-4), so that tests know a tensor's
/// expected digest without OpenSSL (the core is header-only and dependency-light).
class sha256 {
 public:
  sha256& update(std::span<const std::byte> data) noexcept {
    for (auto b : data) {
      block_[fill_++] = static_cast<std::uint8_t>(b);
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    bits_ += 8ull * data.size();
    return *this;
  }
  /// The digest as 64 lowercase hex digits; the object is spent afterwards.
  [[nodiscard]] std::string hex() noexcept {
    const std::uint64_t total = bits_;
    block_[fill_++] = 0x80;
    if (fill_ > 56) {
      while (fill_ < 64) block_[fill_++] = 0;
      compress();
      fill_ = 0;
    }
    while (fill_ < 56) block_[fill_++] = 0;
    for (int i = 7; i >= 0; --i) block_[fill_++] = static_cast<std::uint8_t>(total >> (8 * i));
    compress();
    std::string out;
    for (auto w : h_) out += fmt::format("{:08x}", w);
    return out;
  }

 private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }
  void compress() noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01,
        0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
        0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
        0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08,
        0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
        0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t{block_[4 * i]} << 24) | (std::uint32_t{block_[4 * i + 1]} << 16) |
             (std::uint32_t{block_[4 * i + 2]} << 8) | std::uint32_t{block_[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
      const auto s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const auto s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto [a, b, c, d, e, f, g, h] = h_;
    for (int i = 0; i < 64; ++i) {
      const auto t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const auto t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    const std::uint32_t v[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[static_cast<std::size_t>(i)] += v[i];
  }
  std::array<std::uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t block_[64]{};
  std::size_t fill_ = 0;
  std::uint64_t bits_ = 0;
};

/// SHA-256 (hex) of a generated tensor's bytes, computed in bounded memory.
[[nodiscard]] inline std::string tensor_sha256(std::uint64_t seed, std::string_view name, std::uint64_t size) {
  sha256 h;
  std::vector<std::byte> buf(static_cast<std::size_t>(std::min<std::uint64_t>(size, 1u << 20)));
  for (std::uint64_t off = 0; off < size;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - off));
    fill_bytes(seed, name, off, {buf.data(), n});
    h.update({buf.data(), n});
    off += n;
  }
  return h.hex();
}

// ---- planning --------------------------------------------------------------------

namespace detail {

inline std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

struct plan_builder {
  const generator_options& o;
  checkpoint_layout& p;
  std::string model;  // "model." or "model.language_model."

  void add(std::string name, format::dtype t, std::vector<std::uint64_t> shape, tensor_role role) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    const std::uint64_t bits = n * format::bits(t);
    if (bits % 8) throw config_error(fmt::format("generator: tensor '{}' is not a whole number of bytes", name));
    p.tensors.push_back({std::move(name), t, std::move(shape), bits / 8, 0, 0, role});
  }
  void linear(const std::string& name, std::uint64_t out, std::uint64_t in, tensor_role role) {
    add(name, format::dtype::BF16, {out, in}, role);
  }
  void expert_linear(const std::string& name, std::uint64_t out, std::uint64_t in) {
    add(name, format::dtype::F8_E4M3, {out, in}, tensor_role::routed_expert);
    add(name + "_scale_inv", format::dtype::F32, {ceil_div(out, 128), ceil_div(in, 128)}, tensor_role::expert_scale);
  }
  void mlp(const std::string& prefix, std::uint64_t width, tensor_role role) {
    linear(prefix + "gate_proj.weight", width, o.hidden, role);
    linear(prefix + "up_proj.weight", width, o.hidden, role);
    linear(prefix + "down_proj.weight", o.hidden, width, role);
  }
  void layer(std::uint32_t l, bool moe, tensor_role attn_role, tensor_role mlp_role) {
    const auto pre = fmt::format("{}layers.{}.", model, l);
    const bool draft = attn_role == tensor_role::draft;
    add(pre + "input_layernorm.weight", format::dtype::BF16, {o.hidden}, draft ? attn_role : tensor_role::norm);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
      linear(pre + "self_attn." + proj + ".weight", o.hidden, o.hidden, attn_role);
    add(pre + "post_attention_layernorm.weight", format::dtype::BF16, {o.hidden}, draft ? attn_role : tensor_role::norm);
    if (!moe) {
      mlp(pre + "mlp.", o.intermediate, mlp_role);
      return;
    }
    add(pre + "mlp.gate.weight", format::dtype::BF16, {o.experts, o.hidden}, draft ? mlp_role : tensor_role::router);
    mlp(pre + "mlp.shared_experts.", o.moe_intermediate * std::max<std::uint32_t>(o.shared_experts, 1),
        draft ? mlp_role : tensor_role::shared_expert);
    for (std::uint32_t e = 0; e < o.experts; ++e) {
      const auto ep = fmt::format("{}mlp.experts.{}.", pre, e);
      if (draft) {
        add(ep + "gate_proj.weight", format::dtype::F8_E4M3, {o.moe_intermediate, o.hidden}, tensor_role::draft);
        add(ep + "up_proj.weight", format::dtype::F8_E4M3, {o.moe_intermediate, o.hidden}, tensor_role::draft);
        add(ep + "down_proj.weight", format::dtype::F8_E4M3, {o.hidden, o.moe_intermediate}, tensor_role::draft);
      } else {
        expert_linear(ep + "gate_proj.weight", o.moe_intermediate, o.hidden);
        expert_linear(ep + "up_proj.weight", o.moe_intermediate, o.hidden);
        expert_linear(ep + "down_proj.weight", o.hidden, o.moe_intermediate);
      }
    }
  }
};

inline std::string shard_file_name(std::size_t i, std::size_t n) {
  return fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, n);
}

}  // namespace detail

/// Plans a checkpoint: the tensors, their shards and offsets, every header's
/// JSON and the index. Cheap (no tensor bytes): usable with ~100k tensors.
[[nodiscard]] inline checkpoint_layout make_layout(const generator_options& o) {
  if (o.hidden == 0 || o.layers == 0) throw config_error("generator: hidden and layers must be positive");
  checkpoint_layout p;
  p.options = o;
  detail::plan_builder b{o, p, o.vl_prefix ? "model.language_model." : "model."};
  std::vector<std::vector<std::size_t>> groups;  // shard -> tensor indices, before numbering
  auto mark = [&] { return p.tensors.size(); };

  // Ordinary weights, cut into shards of about max_shard_bytes.
  const std::size_t first_ordinary = mark();
  b.add(b.model + "embed_tokens.weight", format::dtype::BF16, {o.vocab, o.hidden}, tensor_role::embedding);
  for (std::uint32_t l = 0; l < o.layers; ++l)
    b.layer(l, l >= o.dense_layers && o.experts > 0, tensor_role::attention, tensor_role::dense_mlp);
  b.add(b.model + "norm.weight", format::dtype::BF16, {o.hidden}, tensor_role::norm);
  b.add("lm_head.weight", format::dtype::BF16, {o.vocab, o.hidden}, tensor_role::embedding);
  if (o.odd_tensors) {
    b.add(b.model + "odd.scalar", format::dtype::F32, {}, tensor_role::odd);
    b.add(b.model + "odd.empty", format::dtype::BF16, {0, o.hidden}, tensor_role::odd);
    b.add(b.model + "odd.mask", format::dtype::BOOL, {17}, tensor_role::odd);
    b.add(b.model + "odd.positions", format::dtype::I64, {9}, tensor_role::odd);
  }
  {
    std::vector<std::size_t> cur;
    std::uint64_t bytes = 0;
    for (std::size_t i = first_ordinary; i < p.tensors.size(); ++i) {
      const auto sz = p.tensors[i].size;
      if (!cur.empty() && bytes + sz > o.max_shard_bytes) {
        groups.push_back(std::move(cur));
        cur.clear();
        bytes = 0;
      }
      cur.push_back(i);
      bytes += sz;
    }
    if (!cur.empty()) groups.push_back(std::move(cur));
  }

  // Engram-like tables: one shard each, with two small ordinary tensors.
  for (std::uint32_t i = 0; i < o.engram_tables; ++i) {
    const auto pre = fmt::format("{}engram.{}.", b.model, i);
    std::vector<std::size_t> g;
    g.push_back(mark());
    b.add(pre + "norm.weight", format::dtype::BF16, {o.engram_dim}, tensor_role::engram_small);
    g.push_back(mark());
    b.add(pre + "table", format::dtype::F8_E4M3, {o.engram_rows, o.engram_dim}, tensor_role::engram_table);
    g.push_back(mark());
    b.add(pre + "scale", format::dtype::F32, {o.engram_rows, detail::ceil_div(o.engram_dim, 128)}, tensor_role::engram_table);
    g.push_back(mark());
    b.add(pre + "gate.weight", format::dtype::BF16, {o.hidden, o.engram_dim}, tensor_role::engram_small);
    groups.push_back(std::move(g));
  }

  // The draft (MTP) module: layer `layers`, in three shards of its own.
  if (o.draft) {
    const std::size_t first = mark();
    const auto pre = fmt::format("{}layers.{}.", b.model, o.layers);
    b.add(pre + "enorm.weight", format::dtype::BF16, {o.hidden}, tensor_role::draft);
    b.add(pre + "hnorm.weight", format::dtype::BF16, {o.hidden}, tensor_role::draft);
    b.linear(pre + "eh_proj.weight", o.hidden, 2 * o.hidden, tensor_role::draft);
    b.layer(o.layers, o.experts > 0, tensor_role::draft, tensor_role::draft);
    b.add(pre + "shared_head.norm.weight", format::dtype::BF16, {o.hidden}, tensor_role::draft);
    b.linear(pre + "shared_head.head.weight", o.vocab, o.hidden, tensor_role::draft);
    const std::size_t n = p.tensors.size() - first;
    for (std::size_t s = 0; s < 3; ++s) {
      std::vector<std::size_t> g;
      for (std::size_t i = first + n * s / 3; i < first + n * (s + 1) / 3; ++i) g.push_back(i);
      groups.push_back(std::move(g));
    }
  }

  // Number the shards, lay out offsets, render headers and the index.
  nlohmann::json weight_map = nlohmann::json::object();
  for (std::size_t s = 0; s < groups.size(); ++s) {
    planned_shard sh;
    sh.name = detail::shard_file_name(s, groups.size());
    format::writer w(o.alignment);
    w.metadata("format", "pt");
    for (auto i : groups[s]) {
      auto& t = p.tensors[i];
      t.shard = static_cast<std::uint32_t>(s);
      t.begin = w.data_size();
      w.add(t.name, t.type, t.shape, format::fill_function{});
      weight_map[t.name] = sh.name;
      p.total_size += t.size;
    }
    sh.data_size = w.data_size();
    sh.header_json = w.header_json();
    sh.tensors = groups[s];
    p.shards.push_back(std::move(sh));
  }
  // File order: renumber tensors by (shard, offset).
  std::vector<planned_tensor> ordered;
  ordered.reserve(p.tensors.size());
  for (auto& sh : p.shards) {
    for (auto& i : sh.tensors) {
      ordered.push_back(std::move(p.tensors[i]));
      i = ordered.size() - 1;
    }
  }
  p.tensors = std::move(ordered);
  nlohmann::json ix = {{"metadata", {{"total_size", p.total_size}}}, {"weight_map", std::move(weight_map)}};
  p.index_json = ix.dump(2) + "\n";
  return p;
}

/// Options that give a checkpoint of about `target_bytes` (never more than
/// ~10% off for targets above a few MiB; tiny targets get the minimal model).
/// About 40% of the bytes are Engram-like tables, as in the design checkpoint.
[[nodiscard]] inline generator_options options_for_size(std::uint64_t target_bytes, std::uint64_t seed = 1) {
  generator_options o;
  o.seed = seed;
  if (target_bytes < (64u << 20)) {
    o.layers = 3; o.experts = 4;
  } else if (target_bytes < (4ull << 30)) {
    o.layers = 6; o.experts = 16;
  } else {
    o.layers = 12; o.experts = 32;
  }
  o.dense_layers = 1;
  o.engram_tables = 2;
  auto shape = [&](std::uint64_t h) {
    generator_options x = o;
    x.hidden = h;
    x.intermediate = 2 * h;
    x.moe_intermediate = std::max<std::uint64_t>(h / 2, 16);
    x.vocab = 4 * h;
    x.engram_dim = h;
    return x;
  };
  // Closed form of the ordinary bytes for width h (norms and scales left out; see make_layout).
  const double L = o.layers, E = o.experts, D = o.dense_layers;
  auto bytes_of = [&](double h) {
    const double attn = 4 * h * h * 2, dense = 3 * (2 * h) * h * 2, mi = std::max(h / 2, 16.0);
    const double moe = E * h * 2 + 3 * mi * h * 2 + E * (3 * mi * h);
    const double emb = 2 * (4 * h) * h * 2;
    const double draft = 2 * h * h * 2 + attn + moe + 4 * h * h * 2;
    return L * attn + D * dense + (L - D) * moe + emb + draft;
  };
  const double ordinary_target = 0.6 * static_cast<double>(target_bytes);
  std::uint64_t h = 16;
  while (bytes_of(static_cast<double>(h + 16)) <= ordinary_target) h += 16;
  o = shape(h);
  const double engram_bytes = 0.4 * static_cast<double>(target_bytes);
  const double per_row = static_cast<double>(o.engram_dim) + 4.0 * static_cast<double>(detail::ceil_div(o.engram_dim, 128));
  o.engram_rows = std::max<std::uint64_t>(16, static_cast<std::uint64_t>(engram_bytes / o.engram_tables / per_row));
  o.max_shard_bytes = std::clamp<std::uint64_t>(target_bytes / 8, 64u << 10, 4ull << 30);
  return o;
}

/// Writes `plan` into `dir` (created if needed): every shard and the index.
/// Throws io_error on failure.
inline void write_checkpoint(const std::filesystem::path& dir, const checkpoint_layout& plan, std::size_t chunk = 8u << 20) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw io_error(fmt::format("cannot create directory: {}", ec.message()), {dir.string()}, ec.value());
  const auto seed = plan.options.seed;
  for (const auto& sh : plan.shards) {
    format::writer w(plan.options.alignment);
    w.metadata("format", "pt");
    for (auto i : sh.tensors) {
      const auto& t = plan.tensors[i];
      w.add(t.name, t.type, t.shape, [seed, name = t.name](std::uint64_t off, std::span<std::byte> out) {
        fill_bytes(seed, name, off, out);
      });
    }
    w.write(dir / sh.name, chunk);
  }
  const auto ix = dir / std::string(format::index_file_name);
  std::ofstream f(ix, std::ios::binary | std::ios::trunc);
  f << plan.index_json;
  f.close();
  if (!f) throw io_error("cannot write the index", {ix.string()});
}

/// Plans and writes a checkpoint; returns the plan (the ground truth).
inline checkpoint_layout write_checkpoint(const std::filesystem::path& dir, const generator_options& o) {
  auto p = make_layout(o);
  write_checkpoint(dir, p);
  return p;
}

/// What a loader must deliver for one tensor.
struct expected_tensor {
  std::string name;
  format::dtype type = format::dtype::U8;
  std::vector<std::uint64_t> shape;
  std::string sha256;  ///< of the tensor's bytes, lowercase hex

  /// `name<TAB>dtype<TAB>[d0,d1,...]<TAB>sha256` (digest_sink's line format).
  [[nodiscard]] std::string line() const {
    return fmt::format("{}\t{}\t[{}]\t{}", name, format::name(type), fmt::join(shape, ","), sha256);
  }
};

/// The expected (name, dtype, shape, sha256) of every tensor, in file order.
/// Hashes every byte with the generator's own portable SHA-256 (slow: it keeps
/// the core free of OpenSSL), so it is meant for test-sized checkpoints.
[[nodiscard]] inline std::vector<expected_tensor> expected_tensors(const checkpoint_layout& plan) {
  std::vector<expected_tensor> out;
  out.reserve(plan.tensors.size());
  for (const auto& t : plan.tensors)
    out.push_back({t.name, t.type, t.shape, tensor_sha256(plan.options.seed, t.name, t.size)});
  return out;
}

}  // namespace sluice::inline v0::testing
