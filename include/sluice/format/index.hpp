#pragma once
/// \file
/// The sharded index (`model.safetensors.index.json`) and its verification
/// against the shard headers.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/error.hpp>
#include <sluice/format/safetensors.hpp>

namespace sluice::inline v0::format {

/// The conventional index file name.
inline constexpr std::string_view index_file_name = "model.safetensors.index.json";

/// A parsed index: which shard holds each tensor.
struct index {
  std::string file;                                   ///< path or URI, for messages
  std::map<std::string, std::string> weight_map;      ///< tensor name -> shard file name
  std::optional<std::uint64_t> total_size;            ///< metadata.total_size, if present

  /// The distinct shard names, sorted.
  [[nodiscard]] std::vector<std::string> shards() const {
    std::set<std::string> s;
    for (const auto& [_, shard] : weight_map) s.insert(shard);
    return {s.begin(), s.end()};
  }
};

/// True when `name` is a plain file name: not empty, not "." or "..", no '/',
/// no '\\', no NUL. An index must never make the loader open a file elsewhere.
[[nodiscard]] inline bool is_plain_file_name(std::string_view name) noexcept {
  return !name.empty() && name != "." && name != ".." && name.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

/// The first tensor (by name) that `ix` places in `shard`, or "" if none.
[[nodiscard]] inline std::string first_tensor_in(const index& ix, std::string_view shard) {
  for (const auto& [tensor, s] : ix.weight_map)
    if (s == shard) return tensor;
  return {};
}

/// Parses an index JSON. Throws index_error naming the file and the rule.
[[nodiscard]] inline index parse_index(std::string_view text, const std::string& file) {
  using nlohmann::json;
  index ix;
  ix.file = file;
  json root;
  // A tensor listed twice in weight_map is ambiguous (nlohmann keeps the last
  // silently): count the keys of the top-level weight_map while parsing.
  std::string top_key, duplicate;
  std::set<std::string> seen;
  try {
    root = json::parse(text, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::key && depth == 1) top_key = parsed.get<std::string>();
      if (ev == json::parse_event_t::key && depth == 2 && top_key == "weight_map") {
        auto k = parsed.get<std::string>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = std::move(k);
      }
      return true;
    });
  } catch (const json::exception& e) {
    throw index_error("index-json", fmt::format("index is not valid JSON: {}", e.what()), {file});
  }
  if (!duplicate.empty()) throw index_error("duplicate-name", "weight_map lists the tensor twice", {file, duplicate});
  if (!root.is_object()) throw index_error("index-json", "index is not a JSON object", {file});
  auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) throw index_error("index-json", "index has no weight_map object", {file});
  if (auto md = root.find("metadata"); md != root.end() && !md->is_null()) {
    if (!md->is_object()) throw index_error("index-json", "metadata is not an object", {file});
    if (auto ts = md->find("total_size"); ts != md->end()) {
      // Some writers store it as a number, some as a string of digits. A value
      // outside uint64 (a float >= 2^64, a 30-digit string) is an error, not a
      // wrapped or undefined conversion.
      constexpr double two_to_64 = 18446744073709551616.0;
      bool ok = false;
      if (ts->is_number_unsigned()) {
        ix.total_size = ts->get<std::uint64_t>();
        ok = true;
      } else if (ts->is_number_float()) {
        const double d = ts->get<double>();
        if (d >= 0 && d < two_to_64 && d == std::floor(d)) {
          ix.total_size = static_cast<std::uint64_t>(d);
          ok = true;
        }
      } else if (ts->is_string()) {
        const auto& digits = ts->get_ref<const std::string&>();
        const char* end = digits.data() + digits.size();
        std::uint64_t v = 0;
        auto [p, ec] = std::from_chars(digits.data(), end, v);
        if (!digits.empty() && ec == std::errc{} && p == end) {  // from_chars takes no sign for unsigned types
          ix.total_size = v;
          ok = true;
        }
      }
      if (!ok) {
        throw index_error("index-json", fmt::format("metadata.total_size {} is not a non-negative integer", ts->dump()), {file});
      }
    }
  }
  for (auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) throw index_error("index-json", "weight_map value is not a string", {file, tensor});
    const auto& s = shard.get_ref<const std::string&>();
    if (!is_plain_file_name(s))
      throw index_error("shard-name", fmt::format("shard '{}' is not a plain file name inside the checkpoint", s), {file, tensor});
    ix.weight_map.emplace(tensor, s);
  }
  return ix;
}

/// What verification treats as errors. Missing shards and tensors the index
/// names but a shard lacks are always errors.
struct verify_options {
  bool unindexed_tensor_is_error = true;   ///< a shard holds a tensor the index omits
  bool total_size_mismatch_is_error = true;
  /// Receives a message for each relaxed problem (when not an error).
  std::function<void(const std::string&)> warn;
};

/// Verifies `ix` against the headers of the shards it names. `headers` maps a
/// shard file name to its parsed header; a shard the index names that is absent
/// from `headers` is reported as missing.
inline void verify(const index& ix, const std::map<std::string, const header*>& headers, const verify_options& opt = {}) {
  for (const auto& shard : ix.shards())
    if (!headers.contains(shard))
      throw index_error("missing-shard", fmt::format("index names shard '{}', which does not exist", shard),
                        {ix.file, first_tensor_in(ix, shard)});
  for (const auto& [tensor, shard] : ix.weight_map) {
    const header* h = headers.at(shard);
    if (!h->find(tensor))
      throw index_error("missing-tensor", fmt::format("index places the tensor in shard '{}', which does not hold it", shard),
                        {h->file, tensor});
  }
  std::uint64_t total = 0;
  for (const auto& [shard, h] : headers) {
    for (const auto& t : h->tensors) {
      total += t.size();
      auto it = ix.weight_map.find(t.name);
      if (it == ix.weight_map.end() || it->second != shard) {
        const auto msg = it == ix.weight_map.end()
                             ? std::string("shard holds a tensor the index does not list")
                             : fmt::format("shard holds a tensor the index places in '{}'", it->second);
        if (opt.unindexed_tensor_is_error || it != ix.weight_map.end())
          throw index_error("unindexed-tensor", msg, {h->file, t.name});
        if (opt.warn) opt.warn(fmt::format("{} (file '{}', tensor '{}')", msg, h->file, t.name));
      }
    }
  }
  if (ix.total_size && *ix.total_size != total) {
    auto msg = fmt::format("metadata.total_size is {} but the shards hold {} tensor bytes", *ix.total_size, total);
    if (opt.total_size_mismatch_is_error) throw index_error("total-size", msg, {ix.file});
    if (opt.warn) opt.warn(fmt::format("{} (file '{}')", msg, ix.file));
  }
}

}  // namespace sluice::inline v0::format
