// libFuzzer target: the S3 range-answer check (src/http/range_answer.hpp) on
// arbitrary answers. Input: asked first (8 bytes LE), asked end (8), status
// (2), flags (1: bit 0 a Content-Length is present, bit 1 a Content-Range),
// Content-Length (8), then the Content-Range text. Whatever the answer, what
// the check allows lies inside the asked range: the destination's bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <variant>

#include "http/range_answer.hpp"

namespace {
std::uint64_t u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice::http::detail;
  if (size < 27) return 0;
  const std::uint64_t first = u64(data), end = u64(data + 8);
  const unsigned status = data[16] | (data[17] << 8);
  const unsigned flags = data[18];
  const std::uint64_t length = u64(data + 19);
  const std::string_view range(reinterpret_cast<const char*>(data) + 27, size - 27);
  const auto v = check_range_answer(first, end, status, flags & 2 ? std::optional<std::string_view>(range) : std::nullopt,
                                    flags & 1 ? std::optional<std::uint64_t>(length) : std::nullopt);
  if (const auto* b = std::get_if<range_body>(&v)) {
    if (end <= first || b->first != first || b->count > end - first) std::abort();   // past the destination
    if (status == 206 && (!(flags & 1) || length != b->count)) std::abort();
  }
  (void)parse_content_range(range);
  return 0;
}
