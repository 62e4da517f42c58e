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
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/error.hpp>
#include <sluice/format/dtype.hpp>

namespace sluice::inline v0::format {

/// Largest header the reference accepts (bytes of JSON).
inline constexpr std::uint64_t max_header_size = 100'000'000;

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
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : &tensors[it->second];
  }
  void rebuild_lookup() const {
    by_name_.clear();
    for (std::size_t i = 0; i < tensors.size(); ++i) by_name_.emplace(tensors[i].name, i);
  }

 private:
  mutable std::unordered_map<std::string, std::size_t> by_name_;
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

/// Decodes the 8-byte length prefix and checks it against the reference limit
/// and the file size. `first8` must hold at least 8 bytes unless the file is shorter.
[[nodiscard]] inline std::uint64_t parse_header_length(std::span<const std::byte> first8, std::uint64_t file_size,
                                                       const std::string& file) {
  if (file_size < 8 || first8.size() < 8)
    detail::fail(file, "", "header-length",
                 fmt::format("file is {} bytes, shorter than the 8-byte header length", file_size), byte_range{0, file_size});
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(first8[static_cast<std::size_t>(i)]);
  if (n > max_header_size)
    detail::fail(file, "", "header-length",
                 fmt::format("header length {} exceeds the limit of {} bytes", n, max_header_size), byte_range{0, 8});
  if (n > file_size - 8)
    detail::fail(file, "", "header-length",
                 fmt::format("header length {} runs past the end of the {}-byte file", n, file_size), byte_range{8, 8 + n});
  if (n < 2) detail::fail(file, "", "header-json", fmt::format("header of {} bytes cannot hold a JSON object", n), byte_range{8, 8 + n});
  return n;
}

/// Parses and validates the JSON of a header (`text` = the N bytes after the
/// length prefix) for a file of `file_size` bytes. Throws format_error naming
/// the file, the tensor and the rule.
[[nodiscard]] inline header parse_header(std::string_view text, std::uint64_t file_size, const std::string& file) {
  using json = nlohmann::json;
  header h;
  h.file = file;
  h.json_size = text.size();
  h.file_size = file_size;
  const byte_range hdr_range{8, 8 + text.size()};
  if (file_size < 8 || text.size() > file_size - 8)
    detail::fail(file, "", "header-length", fmt::format("header of {} bytes runs past the end of the {}-byte file", text.size(), file_size), hdr_range);
  if (text.empty() || text.front() != '{')
    detail::fail(file, "", "header-json", "header does not start with '{'", hdr_range);
  // Right-padding: the reference allows trailing spaces only.
  auto last = text.find_last_not_of(' ');
  if (last == std::string_view::npos || text[last] != '}')
    detail::fail(file, "", "header-json", "header JSON object is not closed (or padded with something other than spaces)", hdr_range);

  // Duplicate names at the top level: nlohmann keeps the last silently, so a
  // parser callback counts keys at depth 1.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  json root;
  try {
    root = json::parse(text.substr(0, last + 1), [&](int depth, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::key && depth == 1) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    });
  } catch (const json::exception& e) {
    detail::fail(file, "", "header-json", fmt::format("header is not valid UTF-8 JSON: {}", e.what()), hdr_range);
  }
  if (!duplicate.empty()) detail::fail(file, duplicate, "duplicate-name", "tensor name appears twice in the header", hdr_range);
  if (!root.is_object()) detail::fail(file, "", "header-json", "header is not a JSON object", hdr_range);

  for (auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) detail::fail(file, "", "metadata", "__metadata__ is not an object", hdr_range);
      for (auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          detail::fail(file, "", "metadata", fmt::format("__metadata__ value of '{}' is not a string", mk), hdr_range);
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    tensor_info t;
    t.name = key;
    if (!value.is_object()) detail::fail(file, key, "tensor-entry", "tensor entry is not an object", hdr_range);
    for (auto& [field, _] : value.items())
      if (field != "dtype" && field != "shape" && field != "data_offsets")
        detail::fail(file, key, "tensor-entry", fmt::format("unknown field '{}'", field), hdr_range);
    auto dt = value.find("dtype");
    auto sh = value.find("shape");
    auto off = value.find("data_offsets");
    if (dt == value.end() || sh == value.end() || off == value.end())
      detail::fail(file, key, "tensor-entry", "tensor entry needs dtype, shape and data_offsets", hdr_range);
    if (!dt->is_string()) detail::fail(file, key, "dtype", "dtype is not a string", hdr_range);
    auto parsed = parse_dtype(dt->get_ref<const std::string&>());
    if (!parsed) detail::fail(file, key, "dtype", fmt::format("unknown dtype '{}'", dt->get<std::string>()), hdr_range);
    t.type = *parsed;
    if (!sh->is_array()) detail::fail(file, key, "shape", "shape is not an array", hdr_range);
    for (auto& d : *sh) {
      if (!d.is_number_unsigned())
        detail::fail(file, key, "shape", fmt::format("shape entry {} is not a non-negative integer", d.dump()), hdr_range);
      t.shape.push_back(d.get<std::uint64_t>());
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      detail::fail(file, key, "data-offsets", "data_offsets is not [begin, end] of non-negative integers", hdr_range);
    t.begin = (*off)[0].get<std::uint64_t>();
    t.end = (*off)[1].get<std::uint64_t>();
    if (t.end < t.begin)
      detail::fail(file, key, "data-offsets", fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end), hdr_range);
    // Byte size with checked arithmetic; sub-byte dtypes must fill whole bytes.
    std::uint64_t count = 1;
    for (auto d : t.shape)
      if (detail::mul_overflows(count, d, count))
        detail::fail(file, key, "tensor-size", "element count overflows 64 bits", hdr_range);
    std::uint64_t nbits = 0;
    if (detail::mul_overflows(count, bits(t.type), nbits))
      detail::fail(file, key, "tensor-size", "bit size overflows 64 bits", hdr_range);
    if (nbits % 8 != 0)
      detail::fail(file, key, "tensor-size",
                   fmt::format("{} elements of {} ({} bits) are not a whole number of bytes", count, name(t.type), nbits), hdr_range);
    if (nbits / 8 != t.size())
      detail::fail(file, key, "tensor-size",
                   fmt::format("data_offsets span {} bytes but {} {} needs {}", t.size(), fmt::join(t.shape, "x"), name(t.type), nbits / 8),
                   byte_range{8 + text.size() + t.begin, 8 + text.size() + t.end});
    h.tensors.push_back(std::move(t));
  }

  // Layout: sorted by offset the tensors tile [0, data size) exactly.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const tensor_info& a, const tensor_info& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const std::uint64_t data_size = file_size - h.data_start();
  std::uint64_t expect = 0;
  for (const auto& t : h.tensors) {
    const byte_range abs{h.data_start() + t.begin, h.data_start() + t.end};
    if (t.begin < expect)
      detail::fail(file, t.name, "layout", fmt::format("tensor overlaps the previous one (starts at {}, previous ends at {})", t.begin, expect), abs);
    if (t.begin > expect)
      detail::fail(file, t.name, "layout", fmt::format("hole of {} bytes before the tensor (starts at {}, previous ends at {})", t.begin - expect, t.begin, expect), abs);
    expect = t.end;
  }
  if (expect != data_size) {
    const std::string last_name = h.tensors.empty() ? std::string{} : h.tensors.back().name;
    if (expect > data_size)
      detail::fail(file, last_name, "data-end",
                   fmt::format("tensor data ends at {} but the file holds {} data bytes (truncated?)", expect, data_size),
                   byte_range{h.data_start() + data_size, h.data_start() + expect});
    detail::fail(file, last_name, "data-end",
                 fmt::format("{} bytes after the last tensor's data (data ends at {}, file data section is {} bytes)", data_size - expect, expect, data_size),
                 byte_range{h.data_start() + expect, file_size});
  }
  h.rebuild_lookup();
  return h;
}

/// Parses a whole in-memory safetensors file (or at least its header, with the
/// file's total size given separately).
[[nodiscard]] inline header parse_header(std::span<const std::byte> prefix, std::uint64_t file_size, const std::string& file) {
  const auto n = parse_header_length(prefix, file_size, file);
  if (prefix.size() < 8 + n)
    throw format_error("header-length", fmt::format("need {} header bytes, got {}", 8 + n, prefix.size()), {file, "", byte_range{0, 8 + n}});
  return parse_header(std::string_view(reinterpret_cast<const char*>(prefix.data()) + 8, n), file_size, file);
}

}  // namespace sluice::inline v0::format
