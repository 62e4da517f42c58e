// libFuzzer target: one ListObjectsV2 page (src/s3/xml.hpp) as a server may
// send it: parse_list_page then check_list_page for prefix "ck/" and
// max-keys 1000. A page either fails one of them (malformed_xml, or a
// reason) or holds only keys inside the prefix, within S3's limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "s3/xml.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice::s3::detail;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  (void)parse_error_document(body);
  try {
    const auto page = parse_list_page(body);
    if (check_list_page(page, "ck/", 1000)) return 0;
    if (page.objects.size() + page.common_prefixes.size() > 1000) std::abort();
    for (const auto& o : page.objects)
      if (!o.key.starts_with("ck/") || o.key.size() > max_key_bytes) std::abort();
    (void)excerpt(body);
  } catch (const malformed_xml&) {
  }
  return 0;
}
