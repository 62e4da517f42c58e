// Parsing and validation of safetensors headers and the sharded index,
// compiled once (the headers declare them): every translation unit that
// opens a checkpoint would otherwise compile nlohmann::json's parser.

#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sluice::inline v0::format {

header parse_header(std::string_view text, std::uint64_t file_size, const std::string& file) {
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

header parse_header(std::span<const std::byte> prefix, std::uint64_t file_size, const std::string& file) {
  const auto n = parse_header_length(prefix, file_size, file);
  if (prefix.size() < 8 + n)
    throw format_error("header-length", fmt::format("need {} header bytes, got {}", 8 + n, prefix.size()), {file, "", byte_range{0, 8 + n}});
  return parse_header(std::string_view(reinterpret_cast<const char*>(prefix.data()) + 8, n), file_size, file);
}

index parse_index(std::string_view text, const std::string& file) {
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
    if (auto sh = md->find("shards"); sh != md->end() && !sh->is_null()) {
      if (!sh->is_object()) throw index_error("index-json", "metadata.shards is not an object", {file});
      for (auto& [name, rec] : sh->items()) {
        if (!rec.is_object()) throw index_error("index-json", fmt::format("metadata.shards['{}'] is not an object", name), {file});
        shard_record r;
        if (auto sz = rec.find("size"); sz != rec.end()) {
          if (!sz->is_number_unsigned())
            throw index_error("index-json", fmt::format("metadata.shards['{}'].size {} is not a non-negative integer", name, sz->dump()), {file});
          r.size = sz->get<std::uint64_t>();
        }
        if (auto et = rec.find("etag"); et != rec.end()) {
          if (!et->is_string()) throw index_error("index-json", fmt::format("metadata.shards['{}'].etag is not a string", name), {file});
          r.etag = et->get<std::string>();
        }
        ix.shard_records.emplace(name, std::move(r));
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

void verify(const index& ix, const std::map<std::string, const header*>& headers, const verify_options& opt) {
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
