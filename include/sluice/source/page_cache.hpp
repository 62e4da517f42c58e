#pragma once
/// \file
/// Whether a file's range is in the page cache: the test by which the local
/// file source and the node-local cache's block reads choose O_DIRECT (cold)
/// or buffered reads (hot).

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace sluice::inline v0::detail {

/// Pages of [offset, offset + len) of `fd` in the page cache, in bytes
/// (whole pages): cachestat(2) (Linux 6.5+; glibc 2.36 has no wrapper and the
/// installed kernel headers predate it, hence the raw syscall and the ABI
/// structs). An older kernel answers ENOSYS: then nothing counts as cached
/// (and automatic modes read O_DIRECT, and nothing is skipped as cached).
[[nodiscard]] inline std::uint64_t cached_bytes(int fd, std::uint64_t offset, std::uint64_t len) noexcept {
#if defined(__x86_64__) || defined(__aarch64__)
  constexpr long sys_cachestat = 451;  // the same number on every architecture (generic table)
  struct { std::uint64_t off, len; } range{offset, len};
  struct { std::uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; } cs{};
  if (len == 0 || ::syscall(sys_cachestat, fd, &range, &cs, 0) != 0) return 0;
  return cs.nr_cache * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
#else
  (void)fd, (void)offset, (void)len;
  return 0;
#endif
}

/// Whether at least half of [offset, offset + len) of `fd` is in the page cache.
[[nodiscard]] inline bool mostly_cached(int fd, std::uint64_t offset, std::uint64_t len) noexcept {
  return len && cached_bytes(fd, offset, len) * 2 >= len;
}

/// Whether every page of [offset, offset + len) of `fd` is in the page cache.
[[nodiscard]] inline bool fully_cached(int fd, std::uint64_t offset, std::uint64_t len) noexcept {
  if (!len) return false;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto first = offset / page, last = (offset + len - 1) / page;
  return cached_bytes(fd, offset, len) >= (last - first + 1) * page;
}

}  // namespace sluice::inline v0::detail
