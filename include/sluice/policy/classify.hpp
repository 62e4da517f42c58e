#pragma once
/// \file
/// Tensor classes from names: routed experts (expert index parsed from the
/// name), shared/offloaded tables (by pattern and/or a size threshold) and
/// replicated tensors (everything else); which tensors TP ranks split by
/// rows or by columns; and, for pipeline stages, each tensor's layer
/// index and whether a layer-less tensor belongs to the first stage
/// (embeddings) or the last (final norm, lm_head). Patterns are ECMAScript regular expressions,
/// searched (not matched) in the tensor's name.

#include <charconv>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>

#include <fmt/format.h>

#include <sluice/error.hpp>
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

/// Assigns tensor classes by name (and size). Copyable; the regexes are compiled once.
class classifier {
 public:
  explicit classifier(classify_options o = {}) : opt_(std::move(o)) {
    try {
      expert_ = std::regex(opt_.expert_pattern, std::regex::ECMAScript | std::regex::optimize);
      if (!opt_.table_pattern.empty()) table_ = std::regex(opt_.table_pattern, std::regex::ECMAScript | std::regex::optimize);
      if (!opt_.row_sliced_pattern.empty())
        row_ = std::regex(opt_.row_sliced_pattern, std::regex::ECMAScript | std::regex::optimize);
      if (!opt_.column_sliced_pattern.empty())
        column_ = std::regex(opt_.column_sliced_pattern, std::regex::ECMAScript | std::regex::optimize);
      if (!opt_.layer_pattern.empty()) layer_ = std::regex(opt_.layer_pattern, std::regex::ECMAScript | std::regex::optimize);
      if (!opt_.first_pp_stage_pattern.empty())
        first_ = std::regex(opt_.first_pp_stage_pattern, std::regex::ECMAScript | std::regex::optimize);
      if (!opt_.last_pp_stage_pattern.empty())
        last_ = std::regex(opt_.last_pp_stage_pattern, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      throw config_error(fmt::format("classifier: bad pattern: {}", e.what()));
    }
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
    std::smatch m;
    if (!opt_.table_pattern.empty() && std::regex_search(t.name, m, *table_)) {
      t.cls = tensor_class::shared_table;
      t.expert = -1;
      return;
    }
    if (opt_.table_min_bytes && t.size >= opt_.table_min_bytes) {
      t.cls = tensor_class::shared_table;
      t.expert = -1;
      return;
    }
    if (std::regex_search(t.name, m, *expert_) && m.size() > 1) {
      t.cls = tensor_class::routed_expert;
      t.expert = index_in(t.name, m[1].str(), "expert");
      return;
    }
    t.cls = tensor_class::replicated;
    t.expert = -1;
  }

  /// Fills `t.layer` from its name (-1: no layer index, or no layer pattern).
  void layer(tensor_info& t) const {
    std::smatch m;
    t.layer = -1;
    if (layer_ && std::regex_search(t.name, m, *layer_) && m.size() > 1) t.layer = index_in(t.name, m[1].str(), "layer");
  }

  /// The stage a layer-less tensor goes with (first wins when both patterns match).
  [[nodiscard]] pp_anchor anchor(const tensor_info& t) const {
    if (first_ && std::regex_search(t.name, *first_)) return pp_anchor::first;
    if (last_ && std::regex_search(t.name, *last_)) return pp_anchor::last;
    return pp_anchor::every;
  }

  /// A classified copy.
  [[nodiscard]] tensor_info operator()(tensor_info t) const {
    classify(t);
    return t;
  }

  /// Whether TP ranks each take a contiguous block of this tensor's rows.
  [[nodiscard]] bool row_sliced(const tensor_info& t) const {
    return row_ && t.shape.size() >= 1 && t.shape[0] > 0 && std::regex_search(t.name, *row_);
  }
  /// Whether TP ranks each take a block of this tensor's columns (dim 1).
  [[nodiscard]] bool column_sliced(const tensor_info& t) const {
    return column_ && t.shape.size() >= 2 && t.shape[0] > 0 && t.shape[1] > 0 && std::regex_search(t.name, *column_);
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
  static std::int64_t index_in(const std::string& tensor, const std::string& digits, const char* what) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (digits.empty() || ec != std::errc{} || p != digits.data() + digits.size() || v < 0 || v >= max_index)
      throw config_error(fmt::format("tensor '{}': the {} index '{}' captured by the pattern is not a number below 2^32",
                                     tensor, what, digits));
    return v;
  }

  classify_options opt_;
  std::optional<std::regex> expert_;
  std::optional<std::regex> table_;
  std::optional<std::regex> row_;
  std::optional<std::regex> column_;
  std::optional<std::regex> layer_;
  std::optional<std::regex> first_;
  std::optional<std::regex> last_;
};

}  // namespace sluice::inline v0::policy
