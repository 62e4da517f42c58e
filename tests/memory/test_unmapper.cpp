// tests for <sluice/memory/unmapper.hpp>: unmap_later unmaps, off the caller's
// thread, in the process that asked (also in a child forked after the first use).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include <sluice/memory/unmapper.hpp>

using namespace sluice;

#if defined(__SANITIZE_THREAD__)
// The fork case below starts a thread in a child forked from a process that
// has threads (the unmapper's). TSan refuses that unless told otherwise; the
// child only maps, unmaps and exits. Every other test of this binary keeps
// TSan's defaults (the preset's TSAN_OPTIONS add to these).
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }
#endif

namespace {
// A mapping of a memfd of its own name, so that /proc/self/maps tells it
// apart from whatever the kernel later maps at the same address (the
// sanitizer's allocator, a thread's stack): looking for a mapping that starts
// at the address once saw such a newcomer and waited in vain.
struct named_mapping {
  void* addr = nullptr;
  std::string name;
};
named_mapping fresh_mapping(std::size_t n) {
  static int made = 0;
  named_mapping m;
  m.name = "sluice-unmapper-test-" + std::to_string(::getpid()) + "-" + std::to_string(made++);
  const int fd = ::memfd_create(m.name.c_str(), 0);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) return m;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the memfd
  if (p == MAP_FAILED) return m;
  static_cast<char*>(p)[0] = 1;
  m.addr = p;
  return m;
}
// Whether /proc/self/maps still has the mapping named `name`.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const std::string want = "/memfd:" + name + " ";
  while (std::getline(maps, line))
    if ((line + " ").find(want) != std::string::npos) return true;
  return false;
}
// Waits (up to 30 s, a bound for a busy machine, not a speed) for the mapping to go.
bool gone_soon(const std::string& name) {
  for (int i = 0; i < 3000 && mapped(name); ++i) ::usleep(10000);
  return !mapped(name);
}
}  // namespace

TEST_CASE("unmap_later unmaps the range on a thread of its own", "[core][unmapper]") {
  const auto m = fresh_mapping(8 << 20);
  REQUIRE(m.addr != nullptr);
  REQUIRE(mapped(m.name));
  unmap_later(m.addr, 8 << 20);
  REQUIRE(gone_soon(m.name));
}

TEST_CASE("unmap_later works in a child forked after the parent used it", "[core][unmapper]") {
  const auto first = fresh_mapping(1 << 20);
  REQUIRE(first.addr != nullptr);
  unmap_later(first.addr, 1 << 20);  // the parent's thread is running now
  REQUIRE(gone_soon(first.name));
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the parent's thread does not exist here
    const auto m = fresh_mapping(4 << 20);
    if (m.addr == nullptr || !mapped(m.name)) ::_exit(2);
    unmap_later(m.addr, 4 << 20);
    ::_exit(gone_soon(m.name) ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}
