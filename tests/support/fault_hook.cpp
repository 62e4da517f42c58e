// The test fault hook (include/sluice/distributed/fault.hpp): the strong
// definition of the symbol that the library's detail::fault_point calls
// where it is defined. Only tests have it: test executables link it (the
// object library sluice_test_fault_hook), and tools and Python processes
// started by tests preload it (the shared library libsluice_test_faults.so,
// through LD_PRELOAD). No installed library or package contains it.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>

namespace {

int signal_named(const std::string& s) {
  if (s.empty()) return 0;
  if (s.find_first_not_of("0123456789") == std::string::npos) return std::atoi(s.c_str());
  const std::string n = s.rfind("SIG", 0) == 0 ? s.substr(3) : s;
  if (n == "KILL") return SIGKILL;
  if (n == "STOP") return SIGSTOP;
  if (n == "TERM") return SIGTERM;
  if (n == "SEGV") return SIGSEGV;
  if (n == "ABRT") return SIGABRT;
  return 0;
}

}  // namespace

// SLUICE_TEST_FAULT=PHASE:RANK:SIGNAL: raises SIGNAL on this process when a
// load enters PHASE on RANK, the first time; SIGNAL PAUSE<ms> instead
// sleeps the entering thread that many milliseconds.
extern "C" __attribute__((visibility("default"))) void sluice_test_fault_hook(const char* phase_data, std::size_t phase_size,
                                                                             std::size_t rank) noexcept {
  static std::atomic<bool> fired{false};
  const char* spec = std::getenv("SLUICE_TEST_FAULT");
  if (!spec || fired.load()) return;
  const std::string_view phase(phase_data, phase_size);
  const std::string s(spec);
  const auto a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  if (b == std::string::npos || s.compare(0, a, phase) != 0 || a != phase.size()) return;
  if (std::strtoull(s.c_str() + a + 1, nullptr, 10) != rank) return;
  const std::string action = s.substr(b + 1);
  // PAUSE<ms>: the thread entering PHASE sleeps that long (a slow rank, not a dead one).
  if (action.rfind("PAUSE", 0) == 0) {
    if (fired.exchange(true)) return;
    const long ms = std::atol(action.c_str() + 5);
    const timespec d{ms / 1000, (ms % 1000) * 1000000};
    ::nanosleep(&d, nullptr);
    return;
  }
  const int sig = signal_named(action);
  if (sig <= 0 || fired.exchange(true)) return;
  // The moment of the fault, for bench/dead_peer.sh (kill to last exit).
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  std::fprintf(stderr, "sluice: test fault: rank %zu raises signal %d entering phase %s at %lld.%06ld\n", rank, sig,
               std::string(phase).c_str(), static_cast<long long>(t.tv_sec), t.tv_nsec / 1000);
  std::fflush(stderr);
  ::kill(::getpid(), sig);
}
