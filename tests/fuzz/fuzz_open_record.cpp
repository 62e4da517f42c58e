// libFuzzer target: the collective open's record (src/core/open_record.hpp)
// as it arrives from rank 0, damaged or forged: it decodes, or it is a
// comm_error naming rank 0. A decoded record encodes and decodes again to
// the same calls; its parses decode or are a comm_error, encode and decode
// again to the same entries, and the format's checks over them
// (check_header, check_index) accept them or throw the format's errors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sluice/error.hpp>
#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>

#include "core/open_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice;
  namespace rec = sluice::detail::open_record;
  try {
    const auto r = rec::decode(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), 0);
    const auto again = rec::decode(rec::encode(r), 0);
    if (again.calls.size() != r.calls.size() || again.shards.size() != r.shards.size() || again.at != r.at ||
        again.parsed != r.parsed)
      std::abort();
    if (r.parsed.empty()) return 0;
    auto p = rec::decode_parsed(r.parsed, 0);
    std::vector<std::pair<std::string, const format::header*>> headers;
    for (const auto& [name, h] : p.headers) headers.emplace_back(name, &h);
    const auto q = rec::decode_parsed(rec::encode_parsed(p.limits, headers, p.index ? &*p.index : nullptr), 0);
    if (q.headers.size() != p.headers.size() || q.index.has_value() != p.index.has_value() ||
        (q.index && q.index->weight_map != p.index->weight_map))
      std::abort();
    for (auto& [name, h] : p.headers) {
      h.file = name;
      try {
        format::check_header(h, p.limits);
      } catch (const format_error&) {
      }
    }
    if (p.index) try {
        format::check_index(*p.index, p.limits);
      } catch (const index_error&) {
      }
  } catch (const comm::comm_error&) {
  }
  return 0;
}
