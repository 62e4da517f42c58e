// libFuzzer target: parse_size (core/size.hpp), the size grammar of every
// front end (--staging, sizes in Python and vLLM's extra config). A text is
// a positive byte count or a config_error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <sluice/core/size.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    if (sluice::parse_size(std::string_view(reinterpret_cast<const char*>(data), size)) == 0) std::abort();
  } catch (const sluice::config_error&) {
  }
  return 0;
}
