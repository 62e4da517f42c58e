#pragma once
/// \file
/// safetensors headers: parsing and strict validation to the reference rules.
///
/// Layout of a file: 8-byte little-endian N, N bytes of UTF-8 JSON (an object,
/// right-padded with spaces), then the data section. Every tensor's
/// `data_offsets` are relative to the data section; sorted by offset the
/// tensors cover it exactly, with no hole and no overlap, and it ends at the
/// end of the file.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/format/dtype.hpp>
#include <sluice/format/limits.hpp>

namespace sluice::inline v0::format {

/// One tensor as its header describes it.
struct tensor_info {
  std::string name;
  dtype type = dtype::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  ///< offset in the data section
  std::uint64_t end = 0;    ///< one past the last byte, in the data section

  [[nodiscard]] std::uint64_t size() const noexcept { return end - begin; }
  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// A parsed, validated safetensors header.
struct header {
  std::string file;                               ///< path or URI, for messages
  std::uint64_t json_size = 0;                    ///< N, the JSON length incl. padding
  std::uint64_t file_size = 0;
  std::map<std::string, std::string> metadata;    ///< `__metadata__`
  std::vector<tensor_info> tensors;               ///< in file order (by offset)

  /// Offset of the data section in the file (8 + N).
  [[nodiscard]] std::uint64_t data_start() const noexcept { return 8 + json_size; }
  /// Bytes of the header (length prefix + JSON): what opening reads.
  [[nodiscard]] std::uint64_t header_bytes() const noexcept { return 8 + json_size; }
  /// Tensor bytes in this file.
  [[nodiscard]] std::uint64_t data_size() const noexcept { return file_size - data_start(); }
  /// The tensor named `name`, or nullptr.
  [[nodiscard]] const tensor_info* find(std::string_view name) const {
    if (by_name_.empty() && !tensors.empty()) rebuild_lookup();
    auto it = by_name_.find(name);  // heterogeneous: no std::string made per lookup
    return it == by_name_.end() ? nullptr : &tensors[it->second];
  }
  void rebuild_lookup() const {
    by_name_.clear();
    by_name_.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) by_name_.emplace(tensors[i].name, i);
  }
  /// Distinct names in the lookup (fewer than tensors.size() when a name repeats).
  [[nodiscard]] std::size_t lookup_size() const noexcept { return by_name_.size(); }

 private:
  struct name_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  mutable std::unordered_map<std::string, std::size_t, name_hash, std::equal_to<>> by_name_;
};

namespace detail {

[[noreturn]] inline void fail(const std::string& file, const std::string& tensor, const char* rule,
                              std::string detail, std::optional<byte_range> range = std::nullopt) {
  throw format_error(rule, std::move(detail), {file, tensor, range});
}

/// a * b with overflow detection.
inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}

}  // namespace detail

/// Decodes the 8-byte length prefix and checks it against `lim.max_header_bytes`
/// (the reference's limit by default) and the file size. `first8` must hold at
/// least 8 bytes unless the file is shorter.
[[nodiscard]] inline std::uint64_t parse_header_length(std::span<const std::byte> first8, std::uint64_t file_size,
                                                       const std::string& file, const limits& lim = {}) {
  if (file_size < 8 || first8.size() < 8)
    detail::fail(file, "", "header-length",
                 fmt::format("file is {} bytes, shorter than the 8-byte header length", file_size), byte_range{0, file_size});
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(first8[static_cast<std::size_t>(i)]);
  if (n > lim.max_header_bytes)
    detail::fail(file, "", "header-length",
                 fmt::format("header length {} exceeds the limit{}", n, limit_hint(lim.max_header_bytes, "max_header_bytes")),
                 byte_range{0, 8});
  if (n > file_size - 8)
    detail::fail(file, "", "header-length",
                 fmt::format("header length {} runs past the end of the {}-byte file", n, file_size), byte_range{8, 8 + n});
  if (n < 2) detail::fail(file, "", "header-json", fmt::format("header of {} bytes cannot hold a JSON object", n), byte_range{8, 8 + n});
  return n;
}

/// Parses and validates the JSON of a header (`text` = the N bytes after the
/// length prefix) for a file of `file_size` bytes, within `lim` (nesting
/// depth, tensor count, name length: limits.hpp). Throws format_error naming
/// the file, the tensor and the rule; the first rule broken in file order.
/// One pass over the text, no DOM: a header of a million tensors parses in
/// about a second (bench/README.md, "Metadata").
[[nodiscard]] header parse_header(std::string_view text, std::uint64_t file_size, const std::string& file,
                                  const limits& lim = {});

/// Checks a header that was not parsed here (another rank's parse, as it
/// arrived in that rank's record) by every rule parse_header enforces after
/// the JSON: the caps on its size, tensor count and name length, each entry's
/// dtype and byte size, unique names and the tiling of the data section. Sorts
/// the tensors into file order and builds the lookup. Throws format_error as
/// parse_header would.
void check_header(header& h, const limits& lim = {});

/// Parses a whole in-memory safetensors file (or at least its header, with the
/// file's total size given separately).
[[nodiscard]] header parse_header(std::span<const std::byte> prefix, std::uint64_t file_size, const std::string& file,
                                  const limits& lim = {});

}  // namespace sluice::inline v0::format
