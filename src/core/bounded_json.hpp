// JSON (and CBOR) from strangers, parsed within bounds: private to the
// compiled core (format.cpp, collective_open.cpp).
//
// nlohmann's parsers are iterative and its destructor flattens nesting, but
// its CBOR reader recurses once per level and dump() recurses too: a
// document nested a million levels deep overflows the stack in either. The
// parser below counts the depth as the events arrive and stops at the cap,
// before the reader recurses any further; and no message here serialises a
// value it was given without a bound (describe()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/error.hpp>

namespace sluice::inline v0::detail {

using json = nlohmann::json;

/// A value as an error message may quote it: numbers and short strings as
/// they are (strings escaped, cut at `max` bytes), containers by kind.
[[nodiscard]] inline std::string describe(const json& v, std::size_t max = 64) {
  switch (v.type()) {
    case json::value_t::object: return fmt::format("an object of {} members", v.size());
    case json::value_t::array: return fmt::format("an array of {} entries", v.size());
    case json::value_t::string: return "'" + printable(v.get_ref<const std::string&>(), max) + "'";
    case json::value_t::binary: return fmt::format("{} bytes of binary", v.get_binary().size());
    case json::value_t::discarded: return "nothing";
    default: return printable(v.dump(), max);  // a scalar: dump() does not recurse
  }
}

/// Builds the DOM of a document whose nesting stays within `max_depth`;
/// `on_key(depth, key)` sees every object key as it is read (duplicates
/// that the DOM would silently merge). A deeper document stops the parse at
/// the first level past the cap: depth_exceeded() then says so.
class bounded_dom_parser : public nlohmann::detail::json_sax_dom_parser<json> {
  using base = nlohmann::detail::json_sax_dom_parser<json>;

 public:
  bounded_dom_parser(json& root, std::uint32_t max_depth, std::function<void(std::size_t, const std::string&)> on_key = {})
      : base(root, true), max_depth_(max_depth), on_key_(std::move(on_key)) {}

  bool start_object(std::size_t n) { return deeper() && base::start_object(n); }
  bool start_array(std::size_t n) { return deeper() && base::start_array(n); }
  bool end_object() {
    --depth_;
    return base::end_object();
  }
  bool end_array() {
    --depth_;
    return base::end_array();
  }
  bool key(string_t& k) {
    if (on_key_) on_key_(depth_, k);
    return base::key(k);
  }
  [[nodiscard]] bool depth_exceeded() const noexcept { return exceeded_; }

 private:
  bool deeper() {
    if (++depth_ > max_depth_) {
      exceeded_ = true;
      return false;
    }
    return true;
  }
  std::uint32_t max_depth_;
  std::size_t depth_ = 0;
  bool exceeded_ = false;
  std::function<void(std::size_t, const std::string&)> on_key_;
};

/// Walks a CBOR document's item heads without recursion and says what is
/// wrong with it, if anything, before nlohmann's reader sees it: that reader
/// recurses once per nesting level, and once per chunk of an
/// indefinite-length string (0x7F 0x7F ... overflowed the stack under the
/// fuzzer: an indefinite string's chunks nest no deeper by its rules, but
/// nlohmann's reader does not check). sluice writes CBOR with nlohmann's
/// to_cbor, which uses definite lengths only: an indefinite length (or a
/// reserved head) is refused, as are nesting deeper than `max_depth`, a
/// count no remaining byte could hold, and trailing bytes.
[[nodiscard]] inline std::optional<std::string> cbor_shape_problem(std::string_view bytes, std::uint32_t max_depth) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t at = 0;
  std::vector<std::uint64_t> left{1};   // items still to read at each open level (the document: one)
  while (!left.empty()) {
    if (left.back() == 0) {
      left.pop_back();
      continue;
    }
    --left.back();
    if (at >= n) return "it ends early";
    const unsigned major = p[at] >> 5, info = p[at] & 31u;
    ++at;
    std::uint64_t v = info;
    if (info >= 24 && info <= 27) {
      const std::size_t len = std::size_t{1} << (info - 24);
      if (n - at < len) return "it ends early";
      v = 0;
      for (std::size_t i = 0; i < len; ++i) v = (v << 8) | p[at + i];
      at += len;
    } else if (info >= 28) {
      return fmt::format("byte {} holds an indefinite length or a reserved head (0x{:02x})", at - 1, p[at - 1]);
    }
    switch (major) {
      case 2:
      case 3:   // a byte or text string of v bytes
        if (v > n - at) return fmt::format("a string of {} bytes at byte {} runs past the end", v, at);
        at += static_cast<std::size_t>(v);
        break;
      case 4:
      case 5: {  // an array of v items, a map of v pairs
        const std::uint64_t items = major == 5 ? (v > UINT64_MAX / 2 ? UINT64_MAX : v * 2) : v;
        if (items > n - at) return fmt::format("a container of {} items at byte {} holds more than its bytes can", v, at);
        if (left.size() >= max_depth) return fmt::format("nested more than {} levels deep", max_depth);
        left.push_back(items);
        break;
      }
      case 6:   // a tag: one item follows
        left.back() += 1;
        break;
      default:  // integers, simple values, floats: nothing more
        break;
    }
  }
  if (at != n) return fmt::format("{} bytes follow the document", n - at);
  return std::nullopt;
}

/// What a bounded parse gave: the document, or why not.
struct bounded_parse {
  json value;
  bool too_deep = false;
  std::optional<std::string> syntax_error;   ///< the parser's message (bounded by the caller's printable)
};

/// Runs `sax` (an nlohmann SAX handler with depth_exceeded(), such as
/// bounded_dom_parser) over JSON text (`cbor` false) or a CBOR document
/// (strict: no trailing bytes), and says in `out` why it stopped, if it did.
template <class Sax>
void run_bounded(std::string_view text, Sax& sax, bounded_parse& out, bool cbor = false) {
  try {
    const bool ok = cbor ? json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::cbor, true)
                         : json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json, true);
    if (!ok && sax.depth_exceeded()) {
      out.too_deep = true;
      out.value = nullptr;
    } else if (!ok) {
      out.syntax_error = "the document ends early or holds an invalid value";
    }
  } catch (const json::exception& e) {
    out.syntax_error = e.what();
    out.value = nullptr;
  }
}

/// Parses JSON text (`cbor` false) or a CBOR document (strict: no trailing
/// bytes) within `max_depth`.
[[nodiscard]] inline bounded_parse parse_bounded(std::string_view text, std::uint32_t max_depth,
                                                 std::function<void(std::size_t, const std::string&)> on_key = {},
                                                 bool cbor = false) {
  bounded_parse out;
  if (cbor) {
    if (auto bad = cbor_shape_problem(text, max_depth)) {
      if (bad->starts_with("nested more than")) out.too_deep = true;
      else out.syntax_error = "not the CBOR sluice writes: " + *bad;
      return out;
    }
  }
  bounded_dom_parser sax(out.value, max_depth, std::move(on_key));
  run_bounded(text, sax, out, cbor);
  return out;
}

}  // namespace sluice::inline v0::detail
