#pragma once
/// \file
/// Whether a file's range is in the page cache: the test by which the local
/// file source and the node-local cache's block reads choose O_DIRECT (cold)
/// or buffered reads (hot).

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace sluice::inline v0::detail {

/// Whether at least half of [offset, offset + len) of `fd` is in the page
/// cache: cachestat(2) (Linux 6.5+; glibc 2.36 has no wrapper and the
/// installed kernel headers predate it, hence the raw syscall and the ABI
/// structs). An older kernel answers ENOSYS: then nothing counts as cached
/// (and automatic modes read O_DIRECT).
[[nodiscard]] inline bool mostly_cached(int fd, std::uint64_t offset, std::uint64_t len) noexcept {
#if defined(__x86_64__) || defined(__aarch64__)
  constexpr long sys_cachestat = 451;  // the same number on every architecture (generic table)
  struct { std::uint64_t off, len; } range{offset, len};
  struct { std::uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; } cs{};
  if (len == 0 || ::syscall(sys_cachestat, fd, &range, &cs, 0) != 0) return false;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return cs.nr_cache * page * 2 >= len;
#else
  (void)fd, (void)offset, (void)len;
  return false;
#endif
}

}  // namespace sluice::inline v0::detail
