// tests for <sluice/core/unmapper.hpp>: unmap_later unmaps, off the caller's
// thread, in the process that asked (also in a child forked after the first use).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include <sluice/core/unmapper.hpp>

using namespace sluice;

#if defined(__SANITIZE_THREAD__)
// The fork case below starts a thread in a child forked from a process that
// has threads (the unmapper's). TSan refuses that unless told otherwise; the
// child only maps, unmaps and exits. Every other test of this binary keeps
// TSan's defaults (the preset's TSAN_OPTIONS add to these).
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }
#endif

namespace {
// Whether /proc/self/maps has a mapping that starts at `addr`.
bool mapped_at(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::ostringstream want;
  want << std::hex << reinterpret_cast<std::uintptr_t>(addr) << '-';
  while (std::getline(maps, line))
    if (line.rfind(want.str(), 0) == 0) return true;
  return false;
}
void* fresh_mapping(std::size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  static_cast<char*>(p)[0] = 1;
  return p;
}
// Waits (up to 30 s, a bound for a busy machine, not a speed) for the mapping to go.
bool gone_soon(const void* addr) {
  for (int i = 0; i < 3000 && mapped_at(addr); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return !mapped_at(addr);
}
}  // namespace

TEST_CASE("unmap_later unmaps the range on a thread of its own", "[core][unmapper]") {
  void* p = fresh_mapping(8 << 20);
  REQUIRE(mapped_at(p));
  unmap_later(p, 8 << 20);
  REQUIRE(gone_soon(p));
}

TEST_CASE("unmap_later works in a child forked after the parent used it", "[core][unmapper]") {
  void* first = fresh_mapping(1 << 20);
  unmap_later(first, 1 << 20);  // the parent's thread is running now
  REQUIRE(gone_soon(first));
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the parent's thread does not exist here
    void* p = ::mmap(nullptr, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(2);
    unmap_later(p, 4 << 20);
    for (int i = 0; i < 3000 && mapped_at(p); ++i) ::usleep(10000);
    ::_exit(mapped_at(p) ? 1 : 0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}
