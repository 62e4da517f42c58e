// The range-answer check (range_answer.hpp).
#include "range_answer.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::http::detail {

namespace {

// A decimal number of 1 to 20 digits that fits 64 bits, and nothing else.
std::optional<std::uint64_t> number(std::string_view s) noexcept {
  if (s.empty() || s.size() > 20) return std::nullopt;
  for (char c : s)
    if (c < '0' || c > '9') return std::nullopt;
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

range_refusal refuse(std::string code, std::string message) { return {std::move(code), std::move(message)}; }

}  // namespace

std::optional<content_range> parse_content_range(std::string_view v) noexcept {
  if (!v.starts_with("bytes ")) return std::nullopt;
  v.remove_prefix(6);
  const auto slash = v.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  content_range cr;
  const auto range = v.substr(0, slash), total = v.substr(slash + 1);
  if (total != "*") {
    cr.total = number(total);
    if (!cr.total) return std::nullopt;
  }
  if (range != "*") {
    const auto dash = range.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    cr.first = number(range.substr(0, dash));
    cr.last = number(range.substr(dash + 1));
    if (!cr.first || !cr.last || *cr.first > *cr.last) return std::nullopt;
    if (cr.total && *cr.last >= *cr.total) return std::nullopt;
  } else if (!cr.total) {
    return std::nullopt;   // "bytes */*" says nothing
  }
  return cr;
}

std::variant<range_body, range_refusal> check_range_answer(std::uint64_t first, std::uint64_t end, unsigned status,
                                                           std::optional<std::string_view> content_range,
                                                           std::optional<std::uint64_t> content_length) {
  if (end <= first) return refuse("BadRequest", fmt::format("an empty range [{}, {}) was asked for", first, end));
  const auto length_text = content_length ? std::to_string(*content_length) : std::string("missing");
  if (status == 206) {
    const auto cr = content_range ? parse_content_range(*content_range) : std::nullopt;
    if (!cr || !cr->first || !cr->total)
      return refuse("BadContentRange",
                    fmt::format("206 with Content-Range '{}'", content_range ? printable(*content_range, 120) : "missing"));
    // F <= L < T holds (parse_content_range): no subtraction below can wrap.
    const std::uint64_t f = *cr->first, l = *cr->last, t = *cr->total;
    if (first >= t)
      return refuse("BadContentRange",
                    fmt::format("asked for bytes from {}, but the object is {} bytes (the server should answer 416)", first, t));
    const std::uint64_t want_last = std::min(end, t) - 1;
    if (f != first || l != want_last)
      return refuse("BadContentRange", fmt::format("asked for bytes {}-{}, got {}-{}", first, want_last, f, l));
    if (!content_length || *content_length != l - f + 1)
      return refuse("BadContentLength", fmt::format("Content-Length {} for bytes {}-{}", length_text, f, l));
    return range_body{f, l - f + 1, t};
  }
  if (status == 200 && first == 0) {
    // The whole object: a server that ignores Range for a range covering it.
    if (!content_length) return refuse("BadContentLength", "200 without a Content-Length");
    if (*content_length > end) return refuse("RangeIgnored", "the server ignored the Range header");
    return range_body{0, *content_length, *content_length};
  }
  return refuse("RangeIgnored", fmt::format("expected 206 Partial Content, got {}", status));
}

}  // namespace sluice::inline v0::http::detail
