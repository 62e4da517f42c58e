// Parsing and validation of safetensors headers and the sharded index,
// compiled once (the headers declare them): every translation unit that
// opens a checkpoint would otherwise compile nlohmann::json's parser.

#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bounded_json.hpp"

namespace sluice::inline v0::format {

namespace {

// A broken rule: its name, the tensor and what is wrong.
struct rule_failure {
  const char* rule;
  std::string detail;
};

// One tensor entry's own rules, whoever built it (the JSON parse below, or
// check_header over a header another rank parsed): its offsets in order, its
// element and bit counts within 64 bits, whole bytes, and its byte size what
// its shape and dtype need. A size mismatch sets `size_range` to the entry's
// data bytes in the file (the header ends at `data_start`).
std::optional<rule_failure> entry_rule(const tensor_info& t, std::uint64_t data_start, std::optional<byte_range>& size_range) {
  if (t.end < t.begin) return rule_failure{"data-offsets", fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end)};
  std::uint64_t count = 1;
  for (auto d : t.shape)
    if (detail::mul_overflows(count, d, count)) return rule_failure{"tensor-size", "element count overflows 64 bits"};
  std::uint64_t nbits = 0;
  if (detail::mul_overflows(count, bits(t.type), nbits)) return rule_failure{"tensor-size", "bit size overflows 64 bits"};
  if (nbits % 8 != 0)
    return rule_failure{"tensor-size", fmt::format("{} elements of {} ({} bits) are not a whole number of bytes", count,
                                                   name(t.type), nbits)};
  if (nbits / 8 != t.size()) {
    size_range = byte_range{data_start + t.begin, data_start + t.end};
    return rule_failure{"tensor-size", fmt::format("data_offsets span {} bytes but {} {} needs {}", t.size(),
                                                   fmt::join(t.shape, "x"), name(t.type), nbits / 8)};
  }
  return std::nullopt;
}

// The rules over a whole header once its entries are read: file order (by
// offset), unique names, and the entries tiling the data section exactly to
// the end of the file. Builds the lookup by name.
void check_layout(header& h, const byte_range& hdr_range) {
  const auto& file = h.file;
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const tensor_info& x, const tensor_info& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  h.rebuild_lookup();
  // Duplicate names (the reference rejects them; a DOM would keep the last).
  if (h.lookup_size() != h.tensors.size()) {
    std::unordered_set<std::string_view> seen;
    for (const auto& t : h.tensors)
      if (!seen.insert(t.name).second)
        detail::fail(file, t.name, "duplicate-name", "tensor name appears twice in the header", hdr_range);
  }
  const std::uint64_t data_size = h.file_size - h.data_start();
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
                 byte_range{h.data_start() + expect, h.file_size});
  }
}

// A header's JSON length against the cap and its file (the parser's first
// rule, and check_header's).
void check_header_size(const std::string& file, std::uint64_t json_size, std::uint64_t file_size, const limits& lim,
                       const byte_range& hdr_range) {
  if (json_size > lim.max_header_bytes)
    detail::fail(file, "", "header-length",
                 fmt::format("header length {}{}", json_size, limit_hint(lim.max_header_bytes, "max_header_bytes")), hdr_range);
  if (file_size < 8 || json_size > file_size - 8)
    detail::fail(file, "", "header-length",
                 fmt::format("header of {} bytes runs past the end of the {}-byte file", json_size, file_size), hdr_range);
}

// What is wrong with an index entry's shard name (not a plain file name
// inside the checkpoint, or longer than the cap), or nothing.
std::optional<std::string> shard_name_fault(std::string_view shard, const limits& lim) {
  if (is_plain_file_name(shard) && shard.size() <= lim.max_name_bytes) return std::nullopt;
  return fmt::format("shard '{}' is not a plain file name inside the checkpoint{}", printable(shard, 256),
                     shard.size() > lim.max_name_bytes ? " (too long)" : "");
}

// The header's JSON as a stream of events (nlohmann's SAX interface), turned
// into tensor_info entries as they arrive: no DOM of the header is built, so
// a header of a million tensors costs one pass, and every cap (depth, count,
// name length) is checked before anything is kept. The grammar it accepts is
// the reference's: an object of tensor entries {dtype, shape, data_offsets}
// and an optional "__metadata__" object of strings. The first rule broken,
// in file order, ends the parse.
class header_builder {
 public:
  using string_t = std::string;
  using binary_t = nlohmann::json::binary_t;

  header_builder(header& h, const limits& lim, byte_range hdr_range) : h_(h), lim_(lim), range_(hdr_range) {}

  // What ended the parse early: a rule, its tensor and its detail.
  struct failure {
    const char* rule;
    std::string tensor, detail;
  };
  [[nodiscard]] const std::optional<failure>& failed() const noexcept { return failed_; }

  bool null() { return value("null"); }
  bool boolean(bool b) { return value(b ? "true" : "false"); }
  bool number_integer(std::int64_t v) { return value(std::to_string(v)); }
  bool number_float(double, const std::string& text) { return value(printable(text, 64)); }
  bool number_unsigned(std::uint64_t v) {
    if (state_ == in::shape) {
      t_.shape.push_back(v);
      return true;
    }
    if (state_ == in::offsets) {
      if (offsets_ < 2) (offsets_ == 0 ? t_.begin : t_.end) = v;
      ++offsets_;
      return true;
    }
    return value(std::to_string(v));
  }
  bool string(std::string& v) {
    if (state_ == in::metadata) {
      h_.metadata.insert_or_assign(std::move(key_), std::move(v));
      return true;
    }
    if (state_ == in::entry && field_ == field::dtype) {
      const auto parsed = parse_dtype(v);
      if (!parsed) return fail("dtype", t_.name, fmt::format("unknown dtype '{}'", printable(v, 64)));
      t_.type = *parsed;
      return true;
    }
    return value("'" + printable(v, 64) + "'");
  }
  bool binary(binary_t&) { return value("binary"); }

  bool start_object(std::size_t) {
    if (!deeper()) return false;
    switch (state_) {
      case in::top: state_ = in::root; return true;
      case in::root:
        if (metadata_next_) {
          state_ = in::metadata;
          return true;
        }
        state_ = in::entry;
        return true;
      default: return value("an object");
    }
  }
  bool start_array(std::size_t) {
    if (!deeper()) return false;
    if (state_ == in::entry && field_ == field::shape) {
      state_ = in::shape;
      return true;
    }
    if (state_ == in::entry && field_ == field::offsets) {
      state_ = in::offsets;
      offsets_ = 0;
      return true;
    }
    return value("an array");
  }
  bool end_array() {
    --depth_;
    if (state_ == in::offsets && offsets_ != 2) return offsets_wrong();
    state_ = in::entry;
    return true;
  }
  bool end_object() {
    --depth_;
    if (state_ == in::metadata) {
      state_ = in::root;
      return true;
    }
    if (state_ == in::entry) {
      state_ = in::root;
      return entry_done();
    }
    state_ = in::done;
    return true;
  }
  bool key(std::string& k) {
    if (state_ == in::root) {
      metadata_next_ = k == "__metadata__";
      if (metadata_next_) {
        if (metadata_seen_) return fail("duplicate-name", k, "__metadata__ appears twice in the header");
        metadata_seen_ = true;
        return true;
      }
      if (k.size() > lim_.max_name_bytes)
        return fail("name-length", k,
                    fmt::format("a tensor name of {} bytes{}", k.size(), limit_hint(lim_.max_name_bytes, "max_name_bytes")));
      if (h_.tensors.size() >= lim_.max_tensors)
        return fail("tensor-count", "",
                    "the header lists too many tensors" + limit_hint(lim_.max_tensors, "max_tensors"));
      t_ = tensor_info{};
      t_.name = std::move(k);
      seen_ = 0;
      return true;
    }
    if (state_ == in::metadata) {
      key_ = std::move(k);
      return true;
    }
    // A tensor entry's field.
    field_ = k == "dtype" ? field::dtype : k == "shape" ? field::shape : k == "data_offsets" ? field::offsets : field::none;
    if (field_ == field::none)
      return fail("tensor-entry", t_.name, fmt::format("unknown field '{}'", printable(k, 64)));
    const auto bit = 1u << static_cast<unsigned>(field_);
    if (seen_ & bit) return fail("tensor-entry", t_.name, fmt::format("field '{}' appears twice", k));
    seen_ |= bit;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (!failed_) failed_ = failure{"header-json", "", fmt::format("header is not valid UTF-8 JSON: {}", e.what())};
    return false;
  }

 private:
  enum class in : std::uint8_t { top, root, metadata, entry, shape, offsets, done };
  enum class field : std::uint8_t { none, dtype, shape, offsets };

  bool fail(const char* rule, std::string tensor, std::string detail) {
    if (!failed_) failed_ = failure{rule, std::move(tensor), std::move(detail)};
    return false;
  }
  bool deeper() {
    if (++depth_ > lim_.max_depth)
      return fail("header-depth", state_ == in::top || state_ == in::root ? std::string{} : t_.name,
                  "JSON nested too deep" + limit_hint(lim_.max_depth, "max_depth"));
    return true;
  }
  bool offsets_wrong() {
    return fail("data-offsets", t_.name, "data_offsets is not [begin, end] of non-negative integers");
  }
  // A value where the grammar has no place for it (`what` describes it, bounded).
  bool value(const std::string& what) {
    switch (state_) {
      case in::top: return fail("header-json", "", "header is not a JSON object");
      case in::root:
        if (metadata_next_) return fail("metadata", "", "__metadata__ is not an object");
        return fail("tensor-entry", t_.name, "tensor entry is not an object");
      case in::metadata:
        return fail("metadata", "", fmt::format("__metadata__ value of '{}' is not a string", printable(key_, 64)));
      case in::shape:
        return fail("shape", t_.name, fmt::format("shape holds {}, not a non-negative integer", what));
      case in::offsets: return offsets_wrong();
      case in::entry:
        if (field_ == field::dtype) return fail("dtype", t_.name, "dtype is not a string");
        if (field_ == field::shape) return fail("shape", t_.name, "shape is not an array");
        return offsets_wrong();
      case in::done: break;
    }
    return fail("header-json", "", "unexpected value after the header object");
  }
  // A tensor entry is complete: its own rules, then it is kept.
  bool entry_done() {
    if (seen_ != 0b1110) return fail("tensor-entry", t_.name, "tensor entry needs dtype, shape and data_offsets");
    if (auto f = entry_rule(t_, range_.end, size_range_)) return fail(f->rule, t_.name, std::move(f->detail));
    h_.tensors.push_back(std::move(t_));
    return true;
  }

 public:
  std::optional<byte_range> size_range_;   // the tensor-size failure's data bytes

 private:
  header& h_;
  const limits& lim_;
  byte_range range_;
  in state_ = in::top;
  field field_ = field::none;
  std::size_t depth_ = 0;
  bool metadata_next_ = false, metadata_seen_ = false;
  unsigned seen_ = 0;          // fields of the entry seen (bit per field)
  unsigned offsets_ = 0;       // numbers in data_offsets
  tensor_info t_;
  std::string key_;            // the metadata key whose value comes next
  std::optional<failure> failed_;
};

}  // namespace

header parse_header(std::string_view text, std::uint64_t file_size, const std::string& file, const limits& lim) {
  header h;
  h.file = file;
  h.json_size = text.size();
  h.file_size = file_size;
  const byte_range hdr_range{8, 8 + text.size()};
  check_header_size(file, text.size(), file_size, lim, hdr_range);
  if (text.empty() || text.front() != '{')
    detail::fail(file, "", "header-json", "header does not start with '{'", hdr_range);
  // Right-padding: the reference allows trailing spaces only.
  auto last = text.find_last_not_of(' ');
  if (last == std::string_view::npos || text[last] != '}')
    detail::fail(file, "", "header-json", "header JSON object is not closed (or padded with something other than spaces)", hdr_range);

  header_builder b(h, lim, hdr_range);
  const auto json_text = text.substr(0, last + 1);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(json_text.begin(), json_text.end(), &b, nlohmann::json::input_format_t::json, true);
  } catch (const nlohmann::json::exception& e) {
    detail::fail(file, "", "header-json", fmt::format("header is not valid UTF-8 JSON: {}", e.what()), hdr_range);
  }
  if (const auto& f = b.failed())
    detail::fail(file, f->tensor, f->rule, f->detail, f->rule == std::string_view("tensor-size") && b.size_range_ ? b.size_range_ : hdr_range);
  if (!ok) detail::fail(file, "", "header-json", "header is not valid UTF-8 JSON", hdr_range);

  check_layout(h, hdr_range);
  return h;
}

void check_header(header& h, const limits& lim) {
  const auto& file = h.file;
  const byte_range hdr_range{8, 8 + h.json_size};
  check_header_size(file, h.json_size, h.file_size, lim, hdr_range);
  if (h.tensors.size() > lim.max_tensors)
    detail::fail(file, "", "tensor-count", "the header lists too many tensors" + limit_hint(lim.max_tensors, "max_tensors"), hdr_range);
  std::optional<byte_range> size_range;
  for (const auto& t : h.tensors) {
    if (t.name.size() > lim.max_name_bytes)
      detail::fail(file, t.name, "name-length",
                   fmt::format("a tensor name of {} bytes{}", t.name.size(), limit_hint(lim.max_name_bytes, "max_name_bytes")),
                   hdr_range);
    if (t.name == "__metadata__")
      detail::fail(file, t.name, "tensor-entry", "__metadata__ is not a tensor", hdr_range);
    if (static_cast<std::size_t>(t.type) >= dtype_count)
      detail::fail(file, t.name, "dtype", fmt::format("unknown dtype {}", static_cast<unsigned>(t.type)), hdr_range);
    if (auto f = entry_rule(t, h.data_start(), size_range)) detail::fail(file, t.name, f->rule, std::move(f->detail), size_range ? size_range : hdr_range);
  }
  check_layout(h, hdr_range);
}

header parse_header(std::span<const std::byte> prefix, std::uint64_t file_size, const std::string& file,
                    const limits& lim) {
  const auto n = parse_header_length(prefix, file_size, file, lim);
  if (prefix.size() < 8 + n)
    throw format_error("header-length", fmt::format("need {} header bytes, got {}", 8 + n, prefix.size()), {file, "", byte_range{0, 8 + n}});
  return parse_header(std::string_view(reinterpret_cast<const char*>(prefix.data()) + 8, n), file_size, file, lim);
}

namespace {

// The index's JSON as events. The weight_map's entries go straight into the
// index as they arrive: they are the part that grows with the model, and a
// DOM of them (a std::map per object, then copied into the index) cost as
// much as parsing every shard's header (sluice.open of a 10-shard, 2,357-tensor
// checkpoint: 23 % of the time in parse_index, 26 % in the headers). The rest
// of the document (metadata and any other keys), small, is handed to the
// bounded DOM parser as before, with the weight_map as an empty object in it
// so that the checks below read the same. Every cap (depth, count, name
// length) and every rule is checked as the DOM's walk did, and reported in
// the same order.
class index_builder {
 public:
  using json = sluice::detail::json;
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  index_builder(json& root, index& ix, const limits& lim) : dom_(root, lim.max_depth), ix_(ix), lim_(lim) {}

  bool null() { return scalar([&] { return dom_.null(); }); }
  bool boolean(bool b) { return scalar([&] { return dom_.boolean(b); }); }
  bool number_integer(number_integer_t v) { return scalar([&] { return dom_.number_integer(v); }); }
  bool number_unsigned(number_unsigned_t v) { return scalar([&] { return dom_.number_unsigned(v); }); }
  bool number_float(number_float_t v, const string_t& s) { return scalar([&] { return dom_.number_float(v, s); }); }
  bool binary(binary_t& v) { return scalar([&] { return dom_.binary(v); }); }
  bool string(string_t& v) {
    if (skipping()) return true;
    if (!member()) return dom_.string(v);
    if (entry_ != ix_.weight_map.end()) {
      if (auto why = shard_name_fault(v, lim_)) fault(entry_->first, "shard-name", std::move(*why));
      else entry_->second.assign(v);
    }
    return true;
  }
  bool start_object(std::size_t n) {
    const bool value = member();
    if (!deeper()) return false;
    if (value) return not_a_string() && (++skip_, true);
    if (skipping()) return ++skip_, true;
    if (depth_ == 2 && next_is_map_) {  // the weight_map: its entries are kept here, not in the DOM
      next_is_map_ = false;
      in_map_ = true;
      if (map_seen_) twice_ = true;
      map_seen_ = true;
    }
    return dom_.start_object(n);
  }
  bool start_array(std::size_t n) {
    const bool value = member();
    if (!deeper()) return false;
    if (value) return not_a_string() && (++skip_, true);
    if (skipping()) return ++skip_, true;
    next_is_map_ = false;
    return dom_.start_array(n);
  }
  bool end_object() {
    --depth_;
    if (skip_ > 0) return --skip_, true;
    if (in_map_ && depth_ == 1) in_map_ = false;
    return dom_.end_object();
  }
  bool end_array() {
    --depth_;
    if (skip_ > 0) return --skip_, true;
    return dom_.end_array();
  }
  bool key(string_t& k) {
    if (skipping()) return true;
    if (!in_map_) {
      next_is_map_ = depth_ == 1 && k == "weight_map";
      return dom_.key(k);
    }
    ++entries_;
    entry_ = ix_.weight_map.end();
    if (k.size() > lim_.max_name_bytes && long_name_.empty()) long_name_ = k;
    if (entries_ <= lim_.max_tensors) {
      auto [it, fresh] = ix_.weight_map.try_emplace(k);
      if (fresh) entry_ = it;
      else if (duplicate_.empty()) duplicate_ = k;
    }
    return true;
  }
  bool parse_error(std::size_t at, const std::string& token, const nlohmann::detail::exception& e) {
    return dom_.parse_error(at, token, e);
  }

  [[nodiscard]] bool depth_exceeded() const noexcept { return too_deep_; }
  [[nodiscard]] std::uint64_t entries() const noexcept { return entries_; }
  [[nodiscard]] const std::string& long_name() const noexcept { return long_name_; }
  [[nodiscard]] const std::string& duplicate() const noexcept { return duplicate_; }
  [[nodiscard]] bool map_twice() const noexcept { return twice_; }
  // The weight_map entry whose value broke a rule, the first by name (the
  // order in which the DOM's walk met them): its name, rule and detail.
  struct fault_at {
    std::string tensor;
    const char* rule;
    std::string detail;
  };
  [[nodiscard]] const std::optional<fault_at>& fault() const noexcept { return fault_; }

 private:
  // A scalar: an entry's value that is not a string, nothing (nested in
  // one), or the DOM's.
  bool scalar(auto&& to_dom) { return member() ? not_a_string() : skipping() || to_dom(); }
  // An event for the value of a weight_map entry (not one nested in it).
  [[nodiscard]] bool member() const noexcept { return in_map_ && skip_ == 0 && depth_ == 2; }
  [[nodiscard]] bool skipping() const noexcept { return skip_ > 0; }
  bool deeper() {
    if (++depth_ > lim_.max_depth) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  bool not_a_string() {
    if (entry_ != ix_.weight_map.end()) fault(entry_->first, "index-json", "weight_map value is not a string");
    return true;
  }
  void fault(const std::string& tensor, const char* rule, std::string detail) {
    if (!fault_ || tensor < fault_->tensor) fault_ = fault_at{tensor, rule, std::move(detail)};
  }

  sluice::detail::bounded_dom_parser dom_;
  index& ix_;
  const limits& lim_;
  std::size_t depth_ = 0, skip_ = 0;
  bool too_deep_ = false, next_is_map_ = false, in_map_ = false, map_seen_ = false, twice_ = false;
  std::uint64_t entries_ = 0;
  std::map<std::string, std::string>::iterator entry_ = ix_.weight_map.end();
  std::string long_name_, duplicate_;
  std::optional<fault_at> fault_;
};

}  // namespace

index parse_index(std::string_view text, const std::string& file, const limits& lim) {
  using sluice::detail::describe;
  index ix;
  ix.file = file;
  if (text.size() > lim.max_index_bytes)
    throw index_error("index-size",
                      fmt::format("the index is {} bytes{}", text.size(), limit_hint(lim.max_index_bytes, "max_index_bytes")),
                      {file});
  sluice::detail::bounded_parse parsed;
  index_builder sax(parsed.value, ix, lim);
  sluice::detail::run_bounded(text, sax, parsed);
  if (parsed.too_deep)
    throw index_error("index-depth",
                      "JSON nested too deep" + limit_hint(lim.max_depth, "max_depth"),
                      {file});
  if (parsed.syntax_error) throw index_error("index-json", fmt::format("index is not valid JSON: {}", *parsed.syntax_error), {file});
  if (sax.entries() > lim.max_tensors)
    throw index_error("tensor-count",
                      fmt::format("weight_map lists {} tensors{}", sax.entries(), limit_hint(lim.max_tensors, "max_tensors")), {file});
  if (!sax.long_name().empty())
    throw index_error("name-length",
                      fmt::format("a tensor name of {} bytes{}", sax.long_name().size(), limit_hint(lim.max_name_bytes, "max_name_bytes")),
                      {file, sax.long_name()});
  if (!sax.duplicate().empty()) throw index_error("duplicate-name", "weight_map lists the tensor twice", {file, sax.duplicate()});
  if (sax.map_twice()) throw index_error("index-json", "the index holds two weight_map objects", {file});
  const auto& root = parsed.value;
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
        throw index_error("index-json", fmt::format("metadata.total_size {} is not a non-negative integer", describe(*ts)), {file});
      }
    }
    if (auto sh = md->find("shards"); sh != md->end() && !sh->is_null()) {
      if (!sh->is_object()) throw index_error("index-json", "metadata.shards is not an object", {file});
      for (auto& [name, rec] : sh->items()) {
        const auto shown = printable(name, 64);
        if (!rec.is_object()) throw index_error("index-json", fmt::format("metadata.shards['{}'] is not an object", shown), {file});
        shard_record r;
        if (auto sz = rec.find("size"); sz != rec.end()) {
          if (!sz->is_number_unsigned())
            throw index_error("index-json",
                              fmt::format("metadata.shards['{}'].size {} is not a non-negative integer", shown, describe(*sz)),
                              {file});
          r.size = sz->get<std::uint64_t>();
        }
        if (auto et = rec.find("etag"); et != rec.end()) {
          if (!et->is_string()) throw index_error("index-json", fmt::format("metadata.shards['{}'].etag is not a string", shown), {file});
          r.etag = et->get<std::string>();
        }
        ix.shard_records.emplace(name, std::move(r));
      }
    }
  }
  if (const auto& f = sax.fault()) throw index_error(f->rule, f->detail, {file, f->tensor});
  return ix;
}

void check_index(const index& ix, const limits& lim) {
  const auto& file = ix.file;
  if (ix.weight_map.size() > lim.max_tensors)
    throw index_error("tensor-count",
                      fmt::format("weight_map lists {} tensors{}", ix.weight_map.size(), limit_hint(lim.max_tensors, "max_tensors")),
                      {file});
  for (const auto& [tensor, shard] : ix.weight_map) {
    if (tensor.size() > lim.max_name_bytes)
      throw index_error("name-length",
                        fmt::format("a tensor name of {} bytes{}", tensor.size(), limit_hint(lim.max_name_bytes, "max_name_bytes")),
                        {file, tensor});
    if (auto why = shard_name_fault(shard, lim)) throw index_error("shard-name", std::move(*why), {file, tensor});
  }
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
  // Every entry was found in its shard, and a shard's names are unique: so
  // when the shards hold as many tensors as the index lists, each is the
  // one its entry names, and the lookup of each below is only for finding
  // which one the index leaves out or places elsewhere.
  std::uint64_t total = 0, held = 0;
  for (const auto& [shard, h] : headers) {
    held += h->tensors.size();
    for (const auto& t : h->tensors) total += t.size();
  }
  if (held != ix.weight_map.size()) {
    for (const auto& [shard, h] : headers) {
      for (const auto& t : h->tensors) {
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
  }
  if (ix.total_size && *ix.total_size != total) {
    auto msg = fmt::format("metadata.total_size is {} but the shards hold {} tensor bytes", *ix.total_size, total);
    if (opt.total_size_mismatch_is_error) throw index_error("total-size", msg, {ix.file});
    if (opt.warn) opt.warn(fmt::format("{} (file '{}')", msg, ix.file));
  }
}

}  // namespace sluice::inline v0::format
