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

#include <sluice/error.hpp>
#include <sluice/format/safetensors.hpp>

namespace sluice::inline v0::format {

/// The conventional index file name.
inline constexpr std::string_view index_file_name = "model.safetensors.index.json";

/// What an index records about one shard (`metadata.shards.<name>`, a
/// sluice extension other readers ignore): its size in bytes and its ETag
/// (S3, quotes included), each optional.
struct shard_record {
  std::optional<std::uint64_t> size;
  std::optional<std::string> etag;
};

/// A parsed index: which shard holds each tensor.
struct index {
  std::string file;                                   ///< path or URI, for messages
  std::map<std::string, std::string> weight_map;      ///< tensor name -> shard file name
  std::optional<std::uint64_t> total_size;            ///< metadata.total_size, if present
  std::map<std::string, shard_record> shard_records;  ///< metadata.shards, if present

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

/// Parses an index JSON within `lim` (its size, depth, entry count and name
/// lengths: limits.hpp). Throws index_error naming the file and the rule.
[[nodiscard]] index parse_index(std::string_view text, const std::string& file, const limits& lim = {});

/// Checks an index that was not parsed here (another rank's parse) by the
/// rules parse_index enforces on its entries: the entry count, the tensor
/// names' length, and every shard a plain file name. Throws index_error as
/// parse_index would.
void check_index(const index& ix, const limits& lim = {});

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
void verify(const index& ix, const std::map<std::string, const header*>& headers, const verify_options& opt = {});

}  // namespace sluice::inline v0::format
