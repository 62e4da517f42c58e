// libFuzzer target: the safetensors header parser on arbitrary files.
// Any input must either parse into a header that satisfies the layout
// invariants or throw sluice::format_error; anything else (another exception,
// a crash, a sanitizer report) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <sluice/format/safetensors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = format::parse_header(bytes, size, "fuzz.safetensors");
    // Invariants of an accepted header: the tensors tile the data section.
    std::uint64_t at = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != at || t.end < t.begin) std::abort();
      if (h.find(t.name) == nullptr) std::abort();
      at = t.end;
    }
    if (at != h.data_size() || h.data_start() + h.data_size() != size) std::abort();
  } catch (const format_error&) {
  }
  // The same bytes as a header-only read of a larger file (what opening does).
  try {
    const auto n = format::parse_header_length(bytes, size + 4096, "fuzz.safetensors");
    if (8 + n <= size)
      (void)format::parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, n), size + 4096, "fuzz.safetensors");
  } catch (const format_error&) {
  }
  return 0;
}
