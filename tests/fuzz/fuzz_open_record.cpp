// libFuzzer target: the collective open's record (src/core/open_record.hpp)
// as it arrives from rank 0, damaged or forged: it decodes, or it is a
// comm_error naming rank 0. A decoded record encodes and decodes again to
// the same calls.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <sluice/error.hpp>

#include "core/open_record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice;
  namespace rec = sluice::detail::open_record;
  try {
    const auto r = rec::decode(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size), 0);
    const auto again = rec::decode(rec::encode(r), 0);
    if (again.calls.size() != r.calls.size() || again.shards.size() != r.shards.size() || again.at != r.at) std::abort();
  } catch (const comm::comm_error&) {
  }
  return 0;
}
