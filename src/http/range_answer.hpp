// What an HTTP server's answer to a range GET (S3's or any object store's) allows the client to read: a
// pure function of what was asked and the answer's status and headers, with
// no Beast and no I/O, so that it is unit-tested and fuzzed on its own
// (tests/source/test_s3_range_answer.cpp, tests/fuzz/fuzz_range_answer.cpp).
//
// The server is not trusted: anything on the path of an http:// endpoint can
// answer. Every number is parsed strictly, every relation is checked without
// wraparound (first <= last < total; length = last - first + 1), and the
// answer must be exactly the bytes asked for, or the object's tail when the
// object ends inside the range. What it allows never exceeds the destination
// the request was given.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace sluice::inline v0::http::detail {

/// A Content-Range value, "bytes F-L/T" or "bytes */T" (T may be "*").
struct content_range {
  std::optional<std::uint64_t> first, last;
  std::optional<std::uint64_t> total;
};

/// Parses a Content-Range value strictly: decimal digits only (no sign, no
/// spaces), each number within 64 bits, F <= L, and L < T when T is known.
/// nullopt for anything else.
[[nodiscard]] std::optional<content_range> parse_content_range(std::string_view v) noexcept;

/// The bytes an answer carries, relative to the object: [first, first + count),
/// and the object's size.
struct range_body {
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  std::uint64_t object_size = 0;
};

/// Why an answer cannot be used: an S3-style code (BadContentRange,
/// BadContentLength, RangeIgnored) and a message.
struct range_refusal {
  std::string code;
  std::string message;
};

/// Checks the answer to a GET of the object's bytes [first, end) (end >
/// first) that came back with `status`, `content_range` (absent: nullopt)
/// and `content_length` (absent: nullopt):
/// - 206: Content-Range "bytes F-L/T" with F == first, F <= L < T,
///   L == min(end, T) - 1, and Content-Length == L - F + 1;
/// - 200, only when first == 0: the whole object, Content-Length T <= end;
/// - anything else: RangeIgnored.
/// The body it allows starts at `first` and holds at most end - first bytes.
[[nodiscard]] std::variant<range_body, range_refusal> check_range_answer(std::uint64_t first, std::uint64_t end,
                                                                         unsigned status,
                                                                         std::optional<std::string_view> content_range,
                                                                         std::optional<std::uint64_t> content_length);

}  // namespace sluice::inline v0::http::detail
