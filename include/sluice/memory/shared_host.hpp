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
/// Sealed once sized (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL): no process
/// holding it, a local rank or anyone who opened the handle, can truncate
/// it under a rank that maps it (which would turn that rank's reads into
/// SIGBUS). `attach` maps only such a segment: a memfd with those seals,
/// owned by this user, of the size the plan says; any other file the handle
/// names is refused, naming it.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::memory {

/// A mapping of the node's shared segment. Copies share the mapping; it is
/// unmapped when the last copy (and the last lease from `keep()`) goes.
class shared_host {
 public:
  shared_host() = default;

  /// Creates a zero-filled segment of `size` bytes and maps it. Throws io_error.
  [[nodiscard]] static shared_host create(std::size_t size, std::string_view name = "sluice-shared") {
    const int fd = ::memfd_create(std::string(name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) throw io_error(fmt::format("memfd_create failed: {}", std::strerror(errno)), {std::string(name)}, errno);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0 || ::fcntl(fd, F_ADD_SEALS, seals) != 0) {
      const int e = errno;
      ::close(fd);
      throw io_error(fmt::format("cannot size and seal the shared segment at {} bytes: {}", size, std::strerror(e)),
                     {std::string(name)}, e);
    }
    shared_host s;
    s.map_ = std::make_shared<mapping>(fd, size);
    return s;
  }

  /// Maps the segment that `handle` names (see handle()); `size` must be its size. Throws io_error.
  [[nodiscard]] static shared_host attach(std::string_view handle, std::size_t size) {
    const std::string path(handle);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw io_error(fmt::format("cannot open the shared segment: {}", std::strerror(errno)), {path}, errno);
    return adopt(fd, size, path);
  }

  /// Maps the segment open as `fd` (which it takes: closed in any case),
  /// after the same checks as attach (a sealed memory file of this user,
  /// `size` bytes); `what` names it in errors. Throws io_error.
  [[nodiscard]] static shared_host adopt(int fd, std::size_t size, const std::string& what = "the shared segment") {
    auto refuse = [&](const std::string& why) {
      ::close(fd);
      throw io_error(fmt::format("refusing the shared segment: {}", why), {what});
    };
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) refuse("not a memory file");
    const int have = ::fcntl(fd, F_GET_SEALS);
    if (have < 0 || (have & seals) != seals)
      refuse(fmt::format("not a sealed sluice segment (seals {:#x}, expected {:#x}): a file a peer could resize", have, seals));
    if (st.st_uid != ::geteuid()) refuse(fmt::format("owned by uid {}, not this process's {}", st.st_uid, ::geteuid()));
    if (static_cast<std::size_t>(st.st_size) != size) refuse(fmt::format("it has {} bytes, expected {}", st.st_size, size));
    shared_host s;
    s.map_ = std::make_shared<mapping>(fd, size);
    s.map_->close_fd();  // the mapping keeps the memory; the fd is not needed
    return s;
  }

  /// The creator's descriptor (-1 once closed or where not the creator): what the node handoff passes.
  [[nodiscard]] int fd() const noexcept { return map_ ? map_->fd : -1; }

  /// "/proc/<pid>/fd/<fd>": how other local processes attach (while the creator holds the fd).
  [[nodiscard]] std::string handle() const {
    if (!map_ || map_->fd < 0) throw config_error("shared segment: no handle (not the creator, or closed)");
    return fmt::format("/proc/{}/fd/{}", ::getpid(), map_->fd);
  }
  /// The creator drops its descriptor (after every rank attached): from now on only mappings hold the memory.
  void close_handle() noexcept {
    if (map_) map_->close_fd();
  }
  /// The mapped bytes (page-aligned start).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept {
    return map_ ? std::span<std::byte>(map_->data, map_->size) : std::span<std::byte>{};
  }
  [[nodiscard]] std::size_t size() const noexcept { return map_ ? map_->size : 0; }
  /// Shared ownership of the mapping (for leases of views into it).
  [[nodiscard]] std::shared_ptr<void> keep() const noexcept { return map_; }
  [[nodiscard]] explicit operator bool() const noexcept { return map_ != nullptr; }

 private:
  static constexpr int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

  struct mapping {
    mapping(int f, std::size_t n) : fd(f), size(n) {
      if (n == 0) return;
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(f);
        fd = -1;
        throw io_error(fmt::format("cannot map {} bytes of the shared segment: {}", n, std::strerror(e)), {}, e);
      }
      data = static_cast<std::byte*>(p);
      // A hint, in every rank's mapping: a shmem page is allocated at the
      // first fault, in the faulting process's mapping, and the ranks fill
      // their shares each in its own. Where the system allows huge pages for
      // shmem on advice (/sys/kernel/mm/transparent_hugepage/shmem_enabled:
      // advise), they come 2 MiB at a time: 1 GiB filled from the page cache
      // and freed in 0.41-0.50 s instead of 0.76-0.85 s here
      // (bench/shmem_fill.c); with the default, never, nothing changes.
      ::madvise(p, n, MADV_HUGEPAGE);
    }
    mapping(const mapping&) = delete;
    mapping& operator=(const mapping&) = delete;
    ~mapping() {
      if (data) ::munmap(data, size);
      close_fd();
    }
    void close_fd() noexcept {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    int fd = -1;
    std::size_t size = 0;
    std::byte* data = nullptr;
  };
  std::shared_ptr<mapping> map_;
};

}  // namespace sluice::inline v0::memory
