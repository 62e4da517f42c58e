// The test fault hook's call site (distributed/fault.hpp). The library holds
// only a weak reference to the hook: where no test has linked or preloaded
// it (every installed library, the pip package, any engine), the reference
// is null and fault_point does nothing, reading no environment.
#include <sluice/distributed/fault.hpp>

extern "C" void sluice_test_fault_hook(const char* phase, std::size_t phase_size, std::size_t rank) noexcept
    __attribute__((weak, visibility("default")));

namespace sluice::inline v0::detail {

void fault_point(std::string_view phase, std::size_t rank) noexcept {
  if (&sluice_test_fault_hook != nullptr) sluice_test_fault_hook(phase.data(), phase.size(), rank);
}

}  // namespace sluice::inline v0::detail
