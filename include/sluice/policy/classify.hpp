#pragma once
/// \file
/// Tensor classes from names: routed experts (expert index parsed from the
/// name), shared/offloaded tables (by pattern and/or a size threshold) and
/// replicated tensors (everything else); which tensors TP ranks split by
/// rows or by columns; and, for pipeline stages, each tensor's layer
/// index and whether a layer-less tensor belongs to the first stage
/// (embeddings) or the last (final norm, lm_head). Patterns are RE2 regular
/// expressions (format/name_pattern.hpp: linear time, no backtracking; the
/// `layers\.(\d+)\.` and `mlp\.experts\.(\d+)\.` forms are matched by
/// hand), searched (not matched) in the tensor's name.

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/format/name_pattern.hpp>
#include <sluice/policy/concepts.hpp>

namespace sluice::inline v0::policy {

/// The patterns a classifier uses.
struct classify_options {
  /// A routed expert's weight; capture group 1 is the expert index.
  std::string expert_pattern = R"(mlp\.experts\.(\d+)\.)";
  /// A shared (offloaded) table. Empty: no pattern.
  std::string table_pattern;
  /// Tensors of at least this many bytes are tables too (0: no threshold).
  std::uint64_t table_min_bytes = 0;
  /// Weights whose rows (dim 0) are split across TP ranks when TP > 1
  /// (column-parallel layers: q/k/v, gate/up, and the vocabulary).
  std::string row_sliced_pattern =
      R"((q_proj|k_proj|v_proj|gate_proj|up_proj|embed_tokens|lm_head)\.weight$)";
  /// Weights whose columns (dim 1) are split across TP ranks when TP > 1
  /// (row-parallel layers: the attention output and the MLP down projection;
  /// their biases and the norms stay whole).
  std::string column_sliced_pattern = R"((o_proj|down_proj)\.weight$)";
  /// A decoder layer's tensor; capture group 1 is the layer index (a PP stage
  /// owns a contiguous range of layers).
  std::string layer_pattern = R"(layers\.(\d+)\.)";
  /// Layer-less tensors that go with the first pipeline stage.
  std::string first_pp_stage_pattern = R"((^|\.)embed_tokens\.)";
  /// Layer-less tensors that go with the last pipeline stage (final norm, lm_head).
  /// Layer-less tensors matching neither pattern are owned by every stage.
  std::string last_pp_stage_pattern = R"((^|\.)lm_head\.|^model\.(language_model\.)?norm\.)";
};

/// Which pipeline stage a layer-less tensor goes with.
enum class pp_anchor : std::uint8_t { every, first, last };

/// Assigns tensor classes by name (and size). Copyable; the patterns are compiled once.
class classifier {
 public:
  /// Throws config_error for a pattern that is not valid RE2, or an expert or
  /// layer pattern without a capture group for the index.
  explicit classifier(classify_options o = {}) : opt_(std::move(o)) {
    expert_ = compiled(opt_.expert_pattern, "expert", true);
    table_ = compiled(opt_.table_pattern, "table", false);
    row_ = compiled(opt_.row_sliced_pattern, "row-sliced", false);
    column_ = compiled(opt_.column_sliced_pattern, "column-sliced", false);
    layer_ = compiled(opt_.layer_pattern, "layer", true);
    first_ = compiled(opt_.first_pp_stage_pattern, "first PP stage", false);
    last_ = compiled(opt_.last_pp_stage_pattern, "last PP stage", false);
  }

  /// The DeepSeek-style preset: `mlp.experts.N.` are routed experts;
  /// `engram.N.table` / `engram.N.scale` are shared tables (the small
  /// `engram.N.*.weight` tensors next to them stay ordinary).
  [[nodiscard]] static classifier deepseek() {
    classify_options o;
    o.table_pattern = R"(engram\.\d+\.(table|scale)$)";
    return classifier(std::move(o));
  }

  /// Fills `t.cls` and `t.expert` from its name and size (`t.layer`: see layer()).
  void classify(tensor_info& t) const {
    if (table_.search(t.name)) {
      t.cls = tensor_class::shared_table;
      t.expert = -1;
      return;
    }
    if (opt_.table_min_bytes && t.size >= opt_.table_min_bytes) {
      t.cls = tensor_class::shared_table;
      t.expert = -1;
      return;
    }
    if (const auto digits = expert_.group(t.name)) {
      t.cls = tensor_class::routed_expert;
      t.expert = index_in(t.name, *digits, "expert");
      return;
    }
    t.cls = tensor_class::replicated;
    t.expert = -1;
  }

  /// Fills `t.layer` from its name (-1: no layer index, or no layer pattern).
  void layer(tensor_info& t) const {
    t.layer = -1;
    if (const auto digits = layer_.group(t.name)) t.layer = index_in(t.name, *digits, "layer");
  }

  /// The stage a layer-less tensor goes with (first wins when both patterns match).
  [[nodiscard]] pp_anchor anchor(const tensor_info& t) const {
    if (first_.search(t.name)) return pp_anchor::first;
    if (last_.search(t.name)) return pp_anchor::last;
    return pp_anchor::every;
  }

  /// A classified copy.
  [[nodiscard]] tensor_info operator()(tensor_info t) const {
    classify(t);
    return t;
  }

  /// Whether TP ranks each take a contiguous block of this tensor's rows.
  [[nodiscard]] bool row_sliced(const tensor_info& t) const {
    return !row_.empty() && t.shape.size() >= 1 && t.shape[0] > 0 && row_.search(t.name);
  }
  /// Whether TP ranks each take a block of this tensor's columns (dim 1).
  [[nodiscard]] bool column_sliced(const tensor_info& t) const {
    return !column_.empty() && t.shape.size() >= 2 && t.shape[0] > 0 && t.shape[1] > 0 && column_.search(t.name);
  }
  /// How `tp` ranks split the tensor: by its patterns, where `tp` divides the
  /// split dimension into whole bytes; otherwise every owner keeps it whole
  /// (an engine that pads uneven shards slices such a tensor itself).
  [[nodiscard]] tp_split split(const tensor_info& t, std::size_t tp) const {
    if (tp <= 1 || t.size == 0) return tp_split::none;
    if (row_sliced(t) && t.shape[0] % tp == 0 && t.size % tp == 0) return tp_split::rows;
    if (column_sliced(t) && t.shape[1] % tp == 0 && (t.size / t.shape[0]) % tp == 0) return tp_split::columns;
    return tp_split::none;
  }

  [[nodiscard]] const classify_options& options() const noexcept { return opt_; }

 private:
  // The number a pattern's capture group found in a (checkpoint-supplied)
  // name: a typed error naming the tensor when it is not a number that fits,
  // never std::stoll's out_of_range escaping into the engine. Bounded by 2^32 so
  // that placement arithmetic (expert x EP) cannot overflow.
  static constexpr std::int64_t max_index = std::int64_t{1} << 32;
  static std::int64_t index_in(const std::string& tensor, std::string_view digits, const char* what) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (digits.empty() || ec != std::errc{} || p != digits.data() + digits.size() || v < 0 || v >= max_index)
      throw config_error(fmt::format("the {} index '{}' captured by the pattern is not a number below 2^32", what,
                                     printable(digits, 40)),
                         {{}, tensor});
    return v;
  }
  // An empty pattern: none (matches nothing).
  static format::name_pattern compiled(const std::string& pattern, const char* what, bool needs_group) {
    if (pattern.empty()) return {};
    format::name_pattern p(pattern);
    if (needs_group && p.groups() < 1)
      throw config_error(fmt::format("classifier: the {} pattern '{}' has no capture group for the index", what, pattern));
    return p;
  }

  classify_options opt_;
  format::name_pattern expert_, table_, row_, column_, layer_, first_, last_;
};

}  // namespace sluice::inline v0::policy
