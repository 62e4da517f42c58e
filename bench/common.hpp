#pragma once
// What several benchmarks need: dropping the page cache (root) and
// destination buffers that are pre-faulted, so first touch is not load time.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <span>
#include <stdexcept>

namespace sluice_bench {

// Writes back dirty pages and drops the page cache; false without root.
inline bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

// The same, or a runtime_error for a bench that cannot measure cold reads otherwise.
inline void require_drop_caches() {
  if (!drop_caches()) throw std::runtime_error("cannot drop caches (needs root)");
}

// n bytes of anonymous memory, hugepage-hinted and touched (never unmapped: a bench's lifetime).
inline std::span<std::byte> prefaulted(std::size_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  ::madvise(p, n, MADV_HUGEPAGE);
  std::memset(p, 1, n);
  return {static_cast<std::byte*>(p), n};
}

}  // namespace sluice_bench
