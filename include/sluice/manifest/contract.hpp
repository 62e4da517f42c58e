#pragma once
/// \file
/// The load contract: what the engine's weight loader applied during the
/// initial load, keyed per application and grouped per layer.
///
/// An *application* is one thing the loader did with one source tensor: it
/// wrote (a part of) destination tensor `destination`, qualified by non-tensor
/// selectors such as a shard id (`q`/`k`/`v` of a fused projection) or an
/// expert id. A `recorder` wraps the loader during the initial load (or a
/// probe), records each application after the call and only if the loader
/// accepted the tensor, and `freeze()`s the keys into one `layer_contract` per
/// layer. Padding and derived destination buffers are never applications, so
/// they never appear in a contract and never hold a layer back.
///
/// Loader signatures (checked at compile time, never by calling to see):
/// - `R(tensor_view, application_log&)`: the loader names what it applied with
///   `log.record(destination, selectors)`;
/// - `R(tensor_view)`: each accepted tensor is one application onto the
///   destination of the same name, without selectors.
/// `R` is `bool` (the loader can decline: `false` records nothing) or `void`
/// (it cannot decline). A probe hands the loader metadata-only views
/// (`view.kind == view_kind::metadata`, empty bytes): the loader records what it
/// would apply and writes nothing. A distributed load's placeholder
/// (`view_kind::placeholder`: a tensor another rank owns) is not a probe view:
/// nothing is applied on this rank, so the recorder neither offers it to the
/// loader nor records it, whatever the loader's signature: were it recorded, a
/// loader that cannot decline would put every other rank's tensor in this
/// rank's contract, and no reload could meet those keys (the rank is never
/// sent their bytes).

#include <algorithm>
#include <compare>
#include <concepts>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <charconv>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/error.hpp>
#include <sluice/format/name_pattern.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0::manifest {

/// A non-tensor selector's value: an integer (expert id) or a string (shard id).
using selector_value = std::variant<std::int64_t, std::string>;

/// The non-tensor selectors of an application, ordered by name.
using selectors = std::map<std::string, selector_value, std::less<>>;

/// Identifies one application of the weight loader.
struct application_key {
  std::string source;       ///< canonical source tensor: its name after renaming (tensor_ref::name)
  std::string destination;  ///< destination tensor id, as the engine names it
  selectors select;         ///< non-tensor selectors (shard id, expert id, ...)

  friend auto operator<=>(const application_key&, const application_key&) = default;
  friend bool operator==(const application_key&, const application_key&) = default;
};

/// "source -> destination {k=v, ...}" (for messages).
[[nodiscard]] inline std::string to_string(const application_key& k) {
  std::string s = fmt::format("{} -> {}", k.source, k.destination);
  if (!k.select.empty()) {
    s += " {";
    bool first = true;
    for (const auto& [name, value] : k.select) {
      if (!first) s += ", ";
      first = false;
      if (const auto* i = std::get_if<std::int64_t>(&value))
        s += fmt::format("{}={}", name, *i);
      else
        s += fmt::format("{}='{}'", name, std::get<std::string>(value));
    }
    s += "}";
  }
  return s;
}

/// The group index of tensors that belong to no layer.
inline constexpr std::int64_t non_layer = -1;

/// "layer 3" or "non-layer tensors" (for messages).
[[nodiscard]] inline std::string layer_name(std::int64_t layer) {
  return layer == non_layer ? std::string("non-layer tensors") : fmt::format("layer {}", layer);
}

/// The default layer pattern: the first capture group is the layer index.
inline constexpr std::string_view default_layer_pattern = R"(layers\.(\d+)\.)";

/// Finds a name's layer with a regular expression (RE2 syntax,
/// format/name_pattern.hpp) whose first capture group is the layer index
/// (searched anywhere in the name); names that do not match belong to
/// `non_layer`.
class layer_grouping {
 public:
  /// Throws config_error for an invalid pattern or one without a capture group.
  explicit layer_grouping(std::string pattern = std::string(default_layer_pattern)) : pattern_(std::move(pattern)) {
    try {
      re_ = format::name_pattern(pattern_);
    } catch (const config_error& e) {
      throw config_error(fmt::format("layer {}", e.detail()));
    }
    if (re_.groups() < 1)
      throw config_error(fmt::format("layer pattern '{}' has no capture group for the layer index", pattern_));
  }

  /// The layer of `name`, or non_layer.
  [[nodiscard]] std::int64_t layer_of(std::string_view name) const {
    const auto digits = re_.group(name);
    if (!digits) return non_layer;
    std::int64_t v = 0;
    const auto [p, ec] = std::from_chars(digits->data(), digits->data() + digits->size(), v);
    if (ec != std::errc{} || p != digits->data() + digits->size() || v < 0) return non_layer;
    return v;
  }
  [[nodiscard]] const std::string& pattern() const noexcept { return pattern_; }

 private:
  std::string pattern_;
  format::name_pattern re_;
};

/// The frozen contract of one layer: every key the initial load applied to it.
struct layer_contract {
  std::int64_t layer = non_layer;
  std::set<application_key> keys;
  std::uint64_t bytes = 0;  ///< bytes of the distinct source tensors of `keys`

  /// The distinct source tensors of the keys.
  [[nodiscard]] std::set<std::string> sources() const {
    std::set<std::string> s;
    for (const auto& k : keys) s.insert(k.source);
    return s;
  }
  friend bool operator==(const layer_contract&, const layer_contract&) = default;
};

/// A model's load contract: one layer_contract per layer (non_layer first),
/// and the pattern that grouped them.
class contract {
 public:
  contract() = default;
  explicit contract(std::string layer_pattern) : pattern_(std::move(layer_pattern)) {}

  [[nodiscard]] const std::string& layer_pattern() const noexcept { return pattern_; }
  [[nodiscard]] const std::map<std::int64_t, layer_contract>& layers() const noexcept { return layers_; }
  /// The layer's contract, or nullptr when the contract has no such group.
  [[nodiscard]] const layer_contract* layer(std::int64_t l) const {
    auto it = layers_.find(l);
    return it == layers_.end() ? nullptr : &it->second;
  }
  /// Number of keys over all layers.
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 0;
    for (const auto& [l, c] : layers_) n += c.keys.size();
    return n;
  }
  [[nodiscard]] bool empty() const noexcept { return layers_.empty(); }
  /// Bytes of the source tensors over all layers.
  [[nodiscard]] std::uint64_t bytes() const noexcept {
    std::uint64_t n = 0;
    for (const auto& [l, c] : layers_) n += c.bytes;
    return n;
  }
  [[nodiscard]] bool contains(const application_key& k) const {
    for (const auto& [l, c] : layers_)
      if (c.keys.contains(k)) return true;
    return false;
  }
  /// The keys (with their layers) whose source is `source_name`.
  [[nodiscard]] std::vector<std::pair<std::int64_t, const application_key*>> keys_of_source(std::string_view source_name) const {
    std::vector<std::pair<std::int64_t, const application_key*>> out;
    for (const auto& [l, c] : layers_)
      for (const auto& k : c.keys)
        if (k.source == source_name) out.emplace_back(l, &k);
    return out;
  }

  /// Adds a key to a layer (creating the layer); `source_bytes` is counted
  /// once per distinct source in the layer.
  void add(std::int64_t layer, application_key key, std::uint64_t source_bytes) {
    auto& lc = layers_[layer];
    lc.layer = layer;
    bool new_source = true;
    for (const auto& k : lc.keys)
      if (k.source == key.source) {
        new_source = false;
        break;
      }
    if (lc.keys.insert(std::move(key)).second && new_source) lc.bytes += source_bytes;
  }

  /// JSON form: {"version":1, "layer_pattern":P, "layers":[{"layer":N|null,
  /// "bytes":B, "keys":[{"source":S, "destination":D, "selectors":{...}}]}]}.
  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& [l, c] : layers_) {
      nlohmann::json keys = nlohmann::json::array();
      for (const auto& k : c.keys) {
        nlohmann::json sel = nlohmann::json::object();
        for (const auto& [name, v] : k.select) {
          if (const auto* i = std::get_if<std::int64_t>(&v))
            sel[name] = *i;
          else
            sel[name] = std::get<std::string>(v);
        }
        keys.push_back({{"source", k.source}, {"destination", k.destination}, {"selectors", std::move(sel)}});
      }
      layers.push_back({{"layer", l == non_layer ? nlohmann::json(nullptr) : nlohmann::json(l)},
                        {"bytes", c.bytes},
                        {"keys", std::move(keys)}});
    }
    return {{"version", 1}, {"layer_pattern", pattern_}, {"layers", std::move(layers)}};
  }

  /// Parses to_json()'s form. Throws contract_error naming what is wrong
  /// (a missing field, a selector neither integer nor string, an empty source).
  [[nodiscard]] static contract from_json(const nlohmann::json& j) {
    try {
      if (!j.is_object() || j.value("version", 0) != 1)
        throw contract_error("contract JSON: expected an object with \"version\": 1");
      contract c(j.at("layer_pattern").get<std::string>());
      for (const auto& lj : j.at("layers")) {
        const std::int64_t l = lj.at("layer").is_null() ? non_layer : lj.at("layer").get<std::int64_t>();
        auto& lc = c.layers_[l];
        lc.layer = l;
        lc.bytes = lj.at("bytes").get<std::uint64_t>();
        for (const auto& kj : lj.at("keys")) {
          application_key k{kj.at("source").get<std::string>(), kj.at("destination").get<std::string>(), {}};
          // why: a reload routes tensors by their source name; a key without
          // one could never be met and would hold its layer back forever.
          if (k.source.empty())
            throw contract_error(fmt::format("contract JSON: a key of {} (destination '{}') has an empty \"source\"",
                                             layer_name(l), k.destination));
          for (const auto& [name, v] : kj.at("selectors").items()) {
            if (v.is_number_integer())
              k.select.emplace(name, v.get<std::int64_t>());
            else if (v.is_string())
              k.select.emplace(name, v.get<std::string>());
            else
              throw contract_error(fmt::format("contract JSON: selector '{}' of '{}' is neither an integer nor a string",
                                               name, k.source));
          }
          lc.keys.insert(std::move(k));
        }
      }
      return c;
    } catch (const nlohmann::json::exception& e) {
      throw contract_error(fmt::format("contract JSON: {}", e.what()));
    }
  }

  friend bool operator==(const contract&, const contract&) = default;

 private:
  std::string pattern_{default_layer_pattern};
  std::map<std::int64_t, layer_contract> layers_;
};

/// Writes the contract's JSON to `path` (replacing it). Throws io_error.
inline void save(const contract& c, const std::filesystem::path& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw io_error("cannot create the contract file", {path.string()});
  f << c.to_json().dump(2) << '\n';
  if (!f.flush()) throw io_error("cannot write the contract file", {path.string()});
}

/// Reads a contract written by save(). Throws io_error or contract_error.
[[nodiscard]] inline contract load_contract(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw io_error("cannot open the contract file", {path.string()});
  try {
    return contract::from_json(nlohmann::json::parse(f));
  } catch (const nlohmann::json::exception& e) {
    throw contract_error(fmt::format("contract JSON: {}", e.what()), {path.string()});
  }
}

/// What a loader is handed to name the applications one call makes. Recorded
/// only once the call returns and only if the loader accepted.
class application_log {
 public:
  application_log(std::string_view source, std::vector<application_key>& out) : source_(source), out_(&out) {}

  /// The loader applied its tensor to `destination`, qualified by `sel`.
  void record(std::string destination, selectors sel = {}) {
    out_->push_back({std::string(source_), std::move(destination), std::move(sel)});
  }
  /// The source tensor of this call.
  [[nodiscard]] std::string_view source() const noexcept { return source_; }

 private:
  std::string_view source_;
  std::vector<application_key>* out_;
};

namespace detail {
template <class F, class R>
concept loader_returning_logged = std::invocable<F&, tensor_view, application_log&> &&
                                  std::same_as<std::invoke_result_t<F&, tensor_view, application_log&>, R>;
template <class F, class R>
concept loader_returning_plain = std::invocable<F&, tensor_view> && std::same_as<std::invoke_result_t<F&, tensor_view>, R>;
}  // namespace detail

/// A weight loader the recorder can wrap: `bool|void(tensor_view, application_log&)`
/// or `bool|void(tensor_view)`.
template <class F>
concept recordable_loader = detail::loader_returning_logged<F, bool> || detail::loader_returning_logged<F, void> ||
                            detail::loader_returning_plain<F, bool> || detail::loader_returning_plain<F, void>;

/// True when the loader can decline (returns bool), from its signature alone.
template <recordable_loader F>
inline constexpr bool can_decline_v =
    detail::loader_returning_logged<F, bool> || (!detail::loader_returning_logged<F, void> && detail::loader_returning_plain<F, bool>);

/// Calls the loader on `v`; returns whether it accepted, and appends the
/// applications it made to `out` only then.
template <recordable_loader F>
bool apply_loader(F& f, tensor_view v, std::vector<application_key>& out) {
  std::vector<application_key> made;
  const std::string source = v.name();
  bool accepted = true;
  if constexpr (detail::loader_returning_logged<F, bool> || detail::loader_returning_logged<F, void>) {
    application_log log(source, made);
    if constexpr (can_decline_v<F>)
      accepted = f(std::move(v), log);
    else
      f(std::move(v), log);
  } else {
    if constexpr (can_decline_v<F>)
      accepted = f(std::move(v));
    else
      f(std::move(v));
    made.push_back({source, source, {}});
  }
  if (accepted) out.insert(out.end(), std::make_move_iterator(made.begin()), std::make_move_iterator(made.end()));
  return accepted;
}

/// Options of a recorder.
struct recorder_options {
  std::string layer_pattern{default_layer_pattern};  ///< layer index from the destination name
};

/// A sink that wraps the engine's weight loader during the initial load (or a
/// probe) and records every accepted application. `freeze()` builds the
/// contract. Delivers whole tensors.
template <recordable_loader F>
class recorder {
 public:
  static constexpr bool whole_tensors = true;
  /// True when the loader can decline (decided from its signature).
  static constexpr bool can_decline = can_decline_v<F>;

  explicit recorder(F loader, recorder_options opt = {}) : loader_(std::move(loader)), grouping_(std::move(opt.layer_pattern)) {}

  /// Offers `v` to the loader; records its applications if it accepted. A
  /// placeholder is neither offered nor recorded (returns false).
  bool accept(tensor_view v) {
    if (v.kind == view_kind::placeholder) return false;
    const std::uint64_t size = v.tensor_size();
    const auto before = applied_.size();
    const bool accepted = apply_loader(loader_, std::move(v), applied_);
    for (auto i = before; i < applied_.size(); ++i) source_bytes_.push_back(size);
    return accepted;
  }

  /// Every application recorded so far, in call order.
  [[nodiscard]] const std::vector<application_key>& applications() const noexcept { return applied_; }

  /// The contract of what was recorded: keys grouped per layer by the
  /// destination name.
  [[nodiscard]] contract freeze() const {
    contract c(grouping_.pattern());
    for (std::size_t i = 0; i < applied_.size(); ++i)
      c.add(grouping_.layer_of(applied_[i].destination), applied_[i], source_bytes_[i]);
    return c;
  }

  [[nodiscard]] F& loader() noexcept { return loader_; }
  [[nodiscard]] const layer_grouping& grouping() const noexcept { return grouping_; }

 private:
  F loader_;
  layer_grouping grouping_;
  std::vector<application_key> applied_;
  std::vector<std::uint64_t> source_bytes_;
};

static_assert(sink<recorder<bool (*)(tensor_view)>>);
static_assert(sink<recorder<void (*)(tensor_view, application_log&)>>);

}  // namespace sluice::inline v0::manifest
