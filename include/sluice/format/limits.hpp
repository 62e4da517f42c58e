#pragma once
/// \file
/// Caps on a checkpoint's metadata, checked before anything in it is trusted.
///
/// A checkpoint comes from whoever published it: every size, count, depth and
/// name in its headers and index is checked against these caps while it is
/// parsed, before memory is sized from it, so a hostile file ends in a named
/// `format_error` / `index_error` (the rule says which cap, the detail gives
/// the limit and how to raise it), never in `bad_alloc`, a stack overflow or
/// a hang. The defaults are far above what real checkpoints hold (a shard of
/// DeepSeek V3 has about 1,500 tensors, the longest names are about 80 bytes,
/// a header nests 3 levels deep).

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::inline v0::format {

/// Largest header the reference accepts (bytes of JSON).
inline constexpr std::uint64_t max_header_size = 100'000'000;

/// Caps on a checkpoint's metadata (open_options::limits). Each cap is a rule
/// of its own when it is exceeded:
/// - `header-length`: a header's JSON is longer than `max_header_bytes`;
/// - `index-size`: the index file is longer than `max_index_bytes`;
/// - `header-depth` / `index-depth`: JSON nested deeper than `max_depth`;
/// - `tensor-count`: a header, or an index's weight_map, lists more than `max_tensors`;
/// - `name-length`: a tensor (or shard) name is longer than `max_name_bytes`.
struct limits {
  /// A header's JSON (the reference's own limit; raising it past the
  /// reference makes files other readers reject).
  std::uint64_t max_header_bytes = max_header_size;
  /// The index file's size.
  std::uint64_t max_index_bytes = 128ull << 20;
  /// Tensors in one header, and entries in an index's weight_map.
  std::uint64_t max_tensors = 1ull << 20;
  /// JSON nesting (a header needs 3 levels, an index 4).
  std::uint32_t max_depth = 16;
  /// A tensor or shard name, in bytes (the longest in real checkpoints are
  /// about 100).
  std::uint32_t max_name_bytes = 1024;

  bool operator==(const limits&) const = default;
};

/// " (limit N: raise limits.FIELD to accept it)": the tail of a cap's message
/// (open_options::limits in C++, sluice.open(limits={...}) in Python).
[[nodiscard]] inline std::string limit_hint(std::uint64_t limit, std::string_view field) {
  return " (limit " + std::to_string(limit) + ": raise limits." + std::string(field) + " to accept it)";
}

}  // namespace sluice::inline v0::format
