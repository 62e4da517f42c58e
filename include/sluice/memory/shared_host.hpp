#pragma once
/// \file
/// `memory::shared_host`: one host-memory segment per node, mapped by every
/// local rank (the home of offloaded tables, read once per node).
///
/// The segment is a memfd: it has no name in /dev/shm, so nothing is left
/// behind when ranks crash — the memory is freed when the last mapping goes.
/// The creator hands its descriptor to the other local ranks
/// (memory/node_handoff.hpp: SCM_RIGHTS over a Unix socket, to processes that
/// prove the load's token), which `adopt` it; or publishes `handle()`
/// ("/proc/<pid>/fd/<fd>") for them to `attach` while it still holds the fd. Page-aligned; the mapping
/// is MAP_SHARED, so a byte written by any rank is seen by all.
///
/// In pieces: a segment may be several memfds, mapped side by side in one
/// contiguous range (every rank's mapping has the same layout), so that the
/// ranks that fill it write each into its own piece (`write`: pwrite, which
/// takes the piece's inode lock). Writing a page that way costs about half
/// what faulting it in through the mapping does (no zeroing, no fault: 8
/// writers of 1 GiB on 2 cores, 0.34-0.51 against 0.70-0.80 CPU s,
/// bench/shmem_writers.c); into one memfd only one writer of the node would
/// write at a time (the lock).
///
/// Sealed once sized (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL): no process
/// holding it, a local rank or anyone who opened the handle, can truncate
/// it under a rank that maps it (which would turn that rank's reads into
/// SIGBUS). `attach` and `adopt` map only such pieces: memfds with those
/// seals, owned by this user, of the sizes the plan says; any other file is
/// refused, naming it.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::memory {

/// A mapping of the node's shared segment. Copies share the mapping; it is
/// unmapped when the last copy (and the last lease from `keep()`) goes.
class shared_host {
 public:
  shared_host() = default;

  /// Creates a zero-filled segment of `size` bytes and maps it. `pieces`:
  /// where each memfd of it starts (ascending, page-aligned, below `size`;
  /// empty or {0}: one memfd). Throws io_error.
  [[nodiscard]] static shared_host create(std::size_t size, std::string_view name = "sluice-shared",
                                          std::span<const std::uint64_t> pieces = {}) {
    const auto starts = piece_starts(size, pieces, std::string(name));
    std::vector<int> fds;
    try {
      for (std::size_t i = 0; i < starts.size(); ++i) {
        const int fd = ::memfd_create(std::string(name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0) {
          const int e = errno;
          throw io_error(fmt::format("memfd_create failed: {}", std::strerror(e)), {std::string(name)}, e);
        }
        fds.push_back(fd);
        const auto n = piece_end(starts, i, size) - starts[i];
        if (::ftruncate(fd, static_cast<off_t>(n)) != 0 || ::fcntl(fd, F_ADD_SEALS, seals) != 0) {
          const int e = errno;
          throw io_error(fmt::format("cannot size and seal the shared segment at {} bytes: {}", size, std::strerror(e)),
                         {std::string(name)}, e);
        }
      }
    } catch (...) {
      for (int fd : fds) ::close(fd);
      throw;
    }
    shared_host s;
    s.map_ = std::make_shared<mapping>(std::move(fds), starts, size);
    return s;
  }

  /// Maps the one-piece segment that `handle` names (see handle()); `size`
  /// must be its size. Throws io_error.
  [[nodiscard]] static shared_host attach(std::string_view handle, std::size_t size) {
    const std::string path(handle);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw io_error(fmt::format("cannot open the shared segment: {}", std::strerror(errno)), {path}, errno);
    auto s = adopt({fd}, size, {}, path);
    s.close_handle();  // the mapping keeps the memory; the fd is not needed
    return s;
  }

  /// Maps the segment whose pieces are open as `fds` (which it takes:
  /// closed by close_handle(), or in any case on failure), after checking
  /// each (a sealed memory file of this user, of its piece's size); `pieces`
  /// as for create; `what` names it in errors. Throws io_error.
  [[nodiscard]] static shared_host adopt(std::vector<int> fds, std::size_t size, std::span<const std::uint64_t> pieces = {},
                                         const std::string& what = "the shared segment") {
    auto refuse = [&](const std::string& why) {
      for (int fd : fds) ::close(fd);
      throw io_error(fmt::format("refusing the shared segment: {}", why), {what});
    };
    std::vector<std::uint64_t> starts;
    try {
      starts = piece_starts(size, pieces, what);
    } catch (...) {
      for (int fd : fds) ::close(fd);
      throw;
    }
    if (fds.size() != starts.size()) refuse(fmt::format("{} pieces, expected {}", fds.size(), starts.size()));
    for (std::size_t i = 0; i < fds.size(); ++i) {
      const auto where = fds.size() > 1 ? fmt::format("piece {}: ", i) : std::string();
      struct stat st {};
      if (::fstat(fds[i], &st) != 0 || !S_ISREG(st.st_mode)) refuse(where + "not a memory file");
      const int have = ::fcntl(fds[i], F_GET_SEALS);
      if (have < 0 || (have & seals) != seals)
        refuse(fmt::format("{}not a sealed sluice segment (seals {:#x}, expected {:#x}): a file a peer could resize", where, have,
                           seals));
      if (st.st_uid != ::geteuid()) refuse(fmt::format("{}owned by uid {}, not this process's {}", where, st.st_uid, ::geteuid()));
      const auto n = piece_end(starts, i, size) - starts[i];
      if (static_cast<std::uint64_t>(st.st_size) != n) refuse(fmt::format("{}it has {} bytes, expected {}", where, st.st_size, n));
    }
    shared_host s;
    s.map_ = std::make_shared<mapping>(std::move(fds), starts, size);
    return s;
  }

  /// The pieces' descriptors (empty once closed): what the node handoff passes.
  [[nodiscard]] std::span<const int> fds() const noexcept { return map_ ? std::span<const int>(map_->fds) : std::span<const int>{}; }
  /// Where each piece starts in the segment.
  [[nodiscard]] std::span<const std::uint64_t> pieces() const noexcept {
    return map_ ? std::span<const std::uint64_t>(map_->starts) : std::span<const std::uint64_t>{};
  }

  /// "/proc/<pid>/fd/<fd>": how other local processes attach a one-piece
  /// segment (while this process holds the fd).
  [[nodiscard]] std::string handle() const {
    if (!map_ || map_->fds.empty()) throw config_error("shared segment: no handle (closed, or never held)");
    if (map_->fds.size() != 1)
      throw config_error(fmt::format("shared segment: {} pieces have no one handle; hand it over (memory/node_handoff.hpp)",
                                     map_->fds.size()));
    return fmt::format("/proc/{}/fd/{}", ::getpid(), map_->fds[0]);
  }
  /// Drops the descriptors (after every rank has the segment and this one
  /// has written its share): from now on only mappings hold the memory.
  void close_handle() noexcept {
    if (map_) map_->close_fds();
  }

  /// Writes `src` at `offset` through the pieces' descriptors (pwrite): a
  /// page written so is allocated without zeroing and without a fault, and
  /// is seen by every mapping. `src` may be a view of a file (the page cache):
  /// a page of it that cannot be read fails the write. Throws io_error naming
  /// the segment and the bytes; usage_error out of range or once closed.
  void write(std::uint64_t offset, std::span<const std::byte> src) const {
    if (!map_ || offset > map_->size || src.size() > map_->size - offset)
      throw usage_error(fmt::format("shared segment: a write of {} bytes at {} outside its {} bytes", src.size(), offset, size()));
    if (map_->fds.empty()) throw usage_error("shared segment: written after close_handle()");
    const auto& starts = map_->starts;
    while (!src.empty()) {
      const auto i = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin() - 1);
      const auto n = std::min<std::uint64_t>(src.size(), piece_end(starts, i, map_->size) - offset);
      const ssize_t w = ::pwrite(map_->fds[i], src.data(), n, static_cast<off_t>(offset - starts[i]));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = w < 0 ? errno : EIO;
        throw io_error(fmt::format("cannot write {} bytes at {} of the shared segment: {}", n, offset,
                                   e == EFAULT ? "its source could not be read (a file changed under the load?)" : std::strerror(e)),
                       {"the node's shared segment"}, e);
      }
      offset += static_cast<std::uint64_t>(w);
      src = src.subspan(static_cast<std::size_t>(w));
    }
  }

  /// The mapped bytes (page-aligned start).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept {
    return map_ ? std::span<std::byte>(map_->data, map_->size) : std::span<std::byte>{};
  }
  [[nodiscard]] std::size_t size() const noexcept { return map_ ? map_->size : 0; }
  /// Shared ownership of the mapping (for leases of views into it).
  [[nodiscard]] std::shared_ptr<void> keep() const noexcept { return map_; }
  /// Whether this object alone holds the mapping in this process: no copy
  /// of it and no lease from keep() is left.
  [[nodiscard]] bool sole() const noexcept { return map_ && map_.use_count() == 1; }

  /// Gives the memory of pieces `part`, `part + parts`, `part + 2 * parts`,
  /// ... back to the system now (MADV_REMOVE: every mapping of them reads
  /// zeros from then on); returns the bytes given back. Only for when no
  /// process of the node will read the segment again: then each of the
  /// node's `parts` ranks frees its share of the pieces at once, where
  /// otherwise the last rank to unmap the segment frees all of it alone
  /// (3.2 GiB of 4 KiB pages: 0.43 s in one rank; 0.22 s with 8 ranks
  /// releasing on 2 cores). A piece the kernel does not release is left
  /// to the unmapping, which frees it all the same.
  std::uint64_t release(std::size_t part, std::size_t parts) const noexcept {
    if (!map_ || map_->size == 0 || parts == 0) return 0;
    std::uint64_t n = 0;
    const auto& starts = map_->starts;
    for (std::size_t i = part; i < starts.size(); i += parts) {
      const auto len = piece_end(starts, i, map_->size) - starts[i];
      if (::madvise(map_->data + starts[i], len, MADV_REMOVE) == 0) n += len;
    }
    return n;
  }
  [[nodiscard]] explicit operator bool() const noexcept { return map_ != nullptr; }

 private:
  static constexpr int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  static constexpr std::size_t page = 4096;
  static constexpr std::size_t huge = std::size_t{2} << 20;

  // The pieces' starts, checked: `pieces`, or {0}.
  static std::vector<std::uint64_t> piece_starts(std::size_t size, std::span<const std::uint64_t> pieces, const std::string& what) {
    if (pieces.empty()) return {0};
    bool ok = pieces[0] == 0;
    for (std::size_t i = 0; ok && i < pieces.size(); ++i)
      ok = pieces[i] % page == 0 && (i == 0 || pieces[i] > pieces[i - 1]) && (pieces[i] < size || (size == 0 && i == 0));
    if (!ok) throw config_error(fmt::format("shared segment: pieces {} do not start at 0, ascend in pages and end below {} bytes",
                                            fmt::join(pieces, ","), size),
                                {what});
    return {pieces.begin(), pieces.end()};
  }
  static std::uint64_t piece_end(const std::vector<std::uint64_t>& starts, std::size_t i, std::size_t size) noexcept {
    return i + 1 < starts.size() ? starts[i + 1] : size;
  }

  struct mapping {
    // Takes `f` (closed on failure too). The pieces go side by side into one
    // reserved range, 2 MiB-aligned where the segment spans one, so that a
    // piece starting at a multiple of 2 MiB can be mapped by huge pages.
    mapping(std::vector<int> f, std::vector<std::uint64_t> s, std::size_t n) : fds(std::move(f)), starts(std::move(s)), size(n) {
      if (n == 0) return;
      const std::size_t slack = n >= huge ? huge : 0;
      void* r = ::mmap(nullptr, n + slack, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (r == MAP_FAILED) fail(n, errno);
      auto* base = static_cast<std::byte*>(r);
      auto* aligned = slack ? reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(base) + huge - 1) / huge * huge) : base;
      if (aligned > base) ::munmap(base, static_cast<std::size_t>(aligned - base));
      if (const auto tail = static_cast<std::size_t>(base + n + slack - (aligned + n))) ::munmap(aligned + n, tail);
      data = aligned;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        const auto len = static_cast<std::size_t>(piece_end(starts, i, n) - starts[i]);
        void* p = ::mmap(data + starts[i], len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fds[i], 0);
        if (p == MAP_FAILED) fail(n, errno);
        // A hint, in every rank's mapping: a shmem page a fault allocates
        // comes in the faulting process's mapping. Where the system allows
        // huge pages for shmem on advice (/sys/kernel/mm/transparent_hugepage/shmem_enabled:
        // advise), faults take them 2 MiB at a time: 1 GiB filled from the
        // page cache and freed in 0.41-0.50 s instead of 0.76-0.85 s here
        // (bench/shmem_fill.c); with the default, never, nothing changes.
        // (Pages `write` allocates come as the system's policy says without
        // advice.)
        ::madvise(p, len, MADV_HUGEPAGE);
      }
    }
    [[noreturn]] void fail(std::size_t n, int e) {
      if (data) ::munmap(data, size);
      data = nullptr;
      close_fds();
      throw io_error(fmt::format("cannot map {} bytes of the shared segment: {}", n, std::strerror(e)), {}, e);
    }
    mapping(const mapping&) = delete;
    mapping& operator=(const mapping&) = delete;
    ~mapping() {
      if (data) ::munmap(data, size);
      close_fds();
    }
    void close_fds() noexcept {
      for (int fd : fds) ::close(fd);
      fds.clear();
    }
    std::vector<int> fds;
    std::vector<std::uint64_t> starts;
    std::size_t size = 0;
    std::byte* data = nullptr;
  };
  std::shared_ptr<mapping> map_;
};

}  // namespace sluice::inline v0::memory
