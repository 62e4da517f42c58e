#pragma once
/// \file
/// `file_source`: positional reads from local files over io_uring.
///
/// Each file is opened twice: buffered, and with O_DIRECT where the file
/// system supports it. A read uses O_DIRECT when the mode allows it and the
/// offset, length and buffer meet the file's direct-I/O alignment (statx
/// DIOALIGN, 4096 if unknown); otherwise the buffered descriptor. In
/// io_mode::automatic a range that is mostly in the page cache already (a
/// checkpoint loaded again, e.g. after an engine restart) is read buffered:
/// O_DIRECT would fetch it from the device again, at a fraction of the
/// speed (see bench/README.md, page-cache-aware reads). Short reads
/// are returned as such (callers resume); errors throw io_error naming the
/// file and byte range.
///
/// Page-cache views (`map`): a range that is mostly in the page cache (any
/// range under io_mode::buffered) can be handed out instead of read, as a view into a private mapping of its file
/// (one per file, made at the first map and kept alive by the views' leases),
/// its pages mapped in beforehand by MADV_POPULATE_READ on the ring's io-wq
/// workers (a range of at most inline_populate_max bytes, every page cached,
/// on the calling thread). No copy and no memory of the process's own: what a hot load of a
/// tensor larger than a staging slot would otherwise first-touch. The view
/// is writable (copy on write: the file is never written). A file shortened
/// after it was opened fails the map with truncated_error; one shortened
/// while views of it are alive makes reading them raise SIGBUS, as with any
/// mapped file (safetensors' mmap too).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/redirect_error.hpp>
#include <boost/system/system_error.hpp>
#include <fmt/format.h>

#include <sluice/memory/lease.hpp>
#include <sluice/core/task.hpp>
#include <sluice/memory/page_reporting.hpp>
#include <sluice/memory/unmapper.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/error.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/source/page_cache.hpp>

namespace sluice::inline v0 {

class file_source {
 public:
  /// Page-cache views of at most this many bytes, every page cached, are
  /// mapped in on the calling thread (see map).
  static constexpr std::uint64_t inline_populate_max = std::uint64_t{16} << 20;
  /// Buffered reads smaller than this are never handed to io-wq: io_uring
  /// tries them on the submitting thread first, which copies a cached range
  /// in less time than the two thread wakes a worker's trip costs (and still
  /// hands a range that is not cached to a worker itself).
  static constexpr std::size_t punt_min = std::size_t{256} << 10;

  /// Opens every path (throws io_error naming the first that fails).
  /// `punt_buffered`: hand buffered reads to io-wq workers (IOSQE_ASYNC), so
  /// that page-cache copies of the reads in flight run on several cores
  /// instead of one after another in the submitting thread (load_options::punt_buffered).
  /// `populate_cached`: map's views of ranges whose every page is cached come
  /// with their pages mapped in (false: the consumer's touches map them in;
  /// load_options::populate_views).
  file_source(uring_context& ring, std::vector<std::string> paths, io_mode mode = io_mode::automatic,
              bool punt_buffered = true, bool populate_cached = true)
      : ring_(&ring), mode_(mode), punt_buffered_(punt_buffered), populate_cached_(populate_cached) {
    files_.reserve(paths.size());
    try {
      for (auto& p : paths) files_.push_back(open_file(std::move(p)));
    } catch (...) {
      close_all();
      throw;
    }
  }
  file_source(const file_source&) = delete;
  file_source& operator=(const file_source&) = delete;
  ~file_source() { close_all(); }

  [[nodiscard]] std::size_t file_count() const noexcept { return files_.size(); }
  [[nodiscard]] std::string file_uri(std::uint32_t file) const { return files_.at(file).path; }
  [[nodiscard]] const io_counters& counters() const noexcept { return counters_; }
  /// Reads issued with O_DIRECT / through the page cache.
  [[nodiscard]] std::uint64_t direct_reads() const noexcept { return counters_direct_.load(); }
  [[nodiscard]] std::uint64_t buffered_reads() const noexcept { return counters_buffered_.load(); }
  [[nodiscard]] std::uint64_t file_size(std::uint32_t file) const { return files_.at(file).size; }
  /// Direct-I/O alignment of a file (memory, offset and length), 0 when O_DIRECT is off.
  [[nodiscard]] std::uint32_t direct_alignment(std::uint32_t file) const {
    const auto& f = files_.at(file);
    return f.direct_fd >= 0 ? f.align : 0;
  }
  /// The alignment under which a read of [offset, offset + length) of
  /// `file` would bypass the page cache, 0 where it would go through it: no
  /// O_DIRECT, or under io_mode::automatic a range mostly in the page cache
  /// (its read is then a copy from there). The rule read_at follows.
  [[nodiscard]] std::uint32_t direct_alignment_at(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    const auto& f = files_.at(file);
    return f.direct_fd >= 0 && bypasses_cache(f, offset, length) ? f.align : 0;
  }

  /// Whether [offset, offset + length) of `file` is better handed out by
  /// `map` than read: io_mode::automatic when the range is mostly in the
  /// page cache (else it is read, O_DIRECT where aligned); io_mode::buffered
  /// always (its reads would go through the page cache too); never under
  /// io_mode::direct.
  [[nodiscard]] bool can_map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    const auto& f = files_.at(file);
    if (mode_ == io_mode::direct || length == 0 || offset + length > f.size) return false;
    return mode_ == io_mode::buffered || maps_uncached_ || detail::mostly_cached(f.fd, offset, length);
  }
  /// Under io_mode::automatic: views of ranges not in the page cache too
  /// (can_map), for ranks that share this node's page cache as their copy,
  /// whose mapping in is the node's cooperative read; reads still bypass it
  /// where they may (read_via_page_cache for those that may not).
  void map_uncached(bool on) noexcept { maps_uncached_ = on; }

  /// A view of bytes [offset, offset + length) of `file` in the page cache
  /// (see the file comment), its pages mapped in first (for a range whose
  /// every page is cached, only if the source populates cached views): the
  /// lease keeps the file's mapping alive. Throws truncated_error when the
  /// file no longer holds the range, io_error for other failures,
  /// cancelled_error after the ring was cancelled.
  [[nodiscard]] task<lease> map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    lease v = view(file, offset, length);   // the range checked, the mapping held
    const auto& f = files_.at(file);
    const error_context where{f.path, "", byte_range{offset, offset + length}};
    std::byte* base = v.bytes().data() - offset;
    const std::uint64_t page = 4096;
    const std::uint64_t begin = offset / page * page, end = std::min((offset + length + page - 1) / page * page,
                                                                     (f.size + page - 1) / page * page);
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    const auto count_mapped = [&] {
      counters_.bytes_read.fetch_add(length, std::memory_order_relaxed);
      mapped_bytes_.fetch_add(length, std::memory_order_relaxed);
    };
    const bool small = end - begin <= inline_populate_max;
    const bool resident = (small || !populate_cached_) && detail::fully_cached(f.fd, begin, end - begin);
    // Every page cached, and mapping in ahead not wanted (no core to spare
    // for it): the consumer's first touches map the pages in, which takes
    // less CPU time in all than MADV_POPULATE_READ, which faults each page
    // in and then walks it once more (bench/README.md, the peers race's
    // 4-rank row). A range not all cached is mapped in below either way:
    // that is its read.
    if (resident && !populate_cached_) {
      count_mapped();
      unpopulated_maps_.fetch_add(1, std::memory_order_relaxed);
      co_return v;
    }
    // A small range whose every page is cached is mapped in here: no disk
    // read can block the thread, the work is a few page-table entries (one
    // per 2 MiB folio), and a trip through io-wq (two thread wakes) cost
    // more than the work; on ranks sharing cores, most of their context
    // switches (bench/HISTORY.md, the peers race's ranks row).
    if (resident) {
      if (::madvise(base + begin, static_cast<std::size_t>(end - begin), MADV_POPULATE_READ) != 0) {
        const int e = errno;
        if (e == EFAULT) throw truncated_error("the file is shorter than when it was opened", where, e);
        throw io_error(fmt::format("mapping the pages in failed: {}", std::strerror(e)), where, e);
      }
      count_mapped();
      inline_maps_.fetch_add(1, std::memory_order_relaxed);
      co_return v;
    }
    // In pieces: the SQE's length is 32 bits, and one piece keeps one io-wq
    // worker busy for a bounded time.
    constexpr std::uint64_t piece = std::uint64_t{256} << 20;
    for (std::uint64_t b = begin; b < end; b += piece) {
      boost::system::error_code ec;
      co_await ring_->async_madvise(base + b, static_cast<std::size_t>(std::min(piece, end - b)), MADV_POPULATE_READ,
                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted) throw cancelled_error("read cancelled");
      if (ec == boost::system::errc::bad_address)  // a page past the end: the file was cut since it was opened
        throw truncated_error("the file is shorter than when it was opened", where, ec.value());
      if (ec) throw io_error(fmt::format("mapping the pages in failed: {}", ec.message()), where, ec.value());
    }
    count_mapped();
    co_return v;
  }
  /// Whether every page of [offset, offset + length) of `file` is in the page cache.
  [[nodiscard]] bool cached(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    const auto& f = files_.at(file);
    return offset + length <= f.size && detail::fully_cached(f.fd, offset, length);
  }

  /// A view of bytes [offset, offset + length) of `file` whose pages are not
  /// mapped in first (map's are): each comes in from the page cache, or the
  /// disk, when touched. Not counted as read. Throws truncated_error when the
  /// file holds less.
  [[nodiscard]] lease view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    auto& f = holding(file, offset, length);
    auto m = mapping_of(f);
    std::byte* base = static_cast<std::byte*>(m.get());
    return lease(std::move(m), {base + offset, static_cast<std::size_t>(length)});
  }

  /// The bytes view() gives, in a mapping of their own that is unmapped
  /// where the lease is dropped: for a copy made at once, which should
  /// neither map the whole file nor leave its unmapping to the process's
  /// unmapping thread. Throws as view(), io_error if mmap fails.
  [[nodiscard]] lease transient_view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    const auto& f = holding(file, offset, length);
    const std::uint64_t page = 4096, begin = offset / page * page;
    const auto n = static_cast<std::size_t>(offset + length - begin);
    if (n == 0) return lease(nullptr, {});
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, f.fd, static_cast<off_t>(begin));
    if (p == MAP_FAILED)
      throw io_error(fmt::format("mmap failed: {}", std::strerror(errno)), {f.path, "", byte_range{offset, offset + length}}, errno);
    auto* base = static_cast<std::byte*>(p);
    return lease(std::shared_ptr<void>(p, [n](void* q) { ::munmap(q, n); }),
                 {base + (offset - begin), static_cast<std::size_t>(length)});
  }

  /// Bytes handed out as page-cache views so far.
  [[nodiscard]] std::uint64_t mapped_bytes() const noexcept { return mapped_bytes_.load(); }
  /// Of the views, those mapped in on the calling thread (see map).
  [[nodiscard]] std::uint64_t inline_maps() const noexcept { return inline_maps_.load(); }
  /// Of the views, those handed out without their pages mapped in (every
  /// page cached, and the source does not populate cached views).
  [[nodiscard]] std::uint64_t unpopulated_maps() const noexcept { return unpopulated_maps_.load(); }

  /// Reads up to dst.size() bytes at `offset` of file `file`; returns the
  /// count (short near end of file, 0 at or past it).
  [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    return read(file, offset, dst, false);
  }
  /// read_at through the page cache, whatever the mode (io_mode::direct
  /// included): bytes other ranks of the node will take from it.
  [[nodiscard]] task<std::size_t> read_via_page_cache(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    return read(file, offset, dst, true);
  }

 private:
  [[nodiscard]] task<std::size_t> read(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst, bool via_cache) {
    const auto& f = files_.at(file);
    // The alignment first: the page cache is asked (a syscall) only for a read that could bypass it.
    const bool aligned = !via_cache && f.direct_fd >= 0 && direct_io_aligned(f.align, offset, dst.size(), dst.data()) &&
                         bypasses_cache(f, offset, dst.size());
    (aligned ? counters_direct_ : counters_buffered_).fetch_add(1, std::memory_order_relaxed);
    const int fd = aligned ? f.direct_fd : f.fd;
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    boost::system::error_code ec;
    const bool punt = punt_buffered_ && dst.size() >= punt_min;
    std::size_t n = co_await ring_->async_read_at(fd, dst, offset, punt && !aligned,
                                                  asio::redirect_error(asio::use_awaitable, ec));
    if (ec == boost::system::errc::invalid_argument && aligned) {
      // Some file systems accept O_DIRECT at open but refuse the read: fall back.
      n = co_await ring_->async_read_at(f.fd, dst, offset, punt, asio::redirect_error(asio::use_awaitable, ec));
    }
    if (ec == asio::error::operation_aborted) throw cancelled_error("read cancelled");
    if (ec)
      throw io_error(fmt::format("read failed: {}", ec.message()), {f.path, "", byte_range{offset, offset + dst.size()}},
                     ec.value());
    counters_.bytes_read.fetch_add(n, std::memory_order_relaxed);
    co_return n;
  }

  struct file {
    std::string path;
    int fd = -1;
    int direct_fd = -1;
    std::uint32_t align = 4096;
    std::uint64_t size = 0;
    std::shared_ptr<void> mapping;  // the whole file, private; made at the first map
  };
  // Whether an aligned read of the range goes past the page cache
  // (direct_alignment_at, read): always but under io_mode::automatic, where
  // a range mostly cached is better copied from there.
  [[nodiscard]] bool bypasses_cache(const file& f, std::uint64_t offset, std::uint64_t length) const noexcept {
    return !(mode_ == io_mode::automatic && detail::mostly_cached(f.fd, offset, length));
  }
  // The file's mapping, made once (reads may run on several threads of the
  // io_context). It outlives the source: views hold it.
  // `file`, which must hold [offset, offset + length): truncated_error where it does not.
  file& holding(std::uint32_t index, std::uint64_t offset, std::uint64_t length) {
    auto& f = files_.at(index);
    if (offset + length > f.size)
      throw truncated_error(fmt::format("the file holds {} bytes", f.size), {f.path, "", byte_range{offset, offset + length}});
    return f;
  }
  std::shared_ptr<void> mapping_of(file& f) {
    std::lock_guard g(map_mu_);
    if (!f.mapping) {
      const auto n = static_cast<std::size_t>(f.size);
      const bool huge = file_mapping_huge_pages();  // may throw (a bad SLUICE_FILE_HUGEPAGES): before the mapping
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, f.fd, 0);
      if (p == MAP_FAILED) throw io_error(fmt::format("mmap failed: {}", std::strerror(errno)), {f.path}, errno);
      // A hint: what a view brings in from disk comes in 2 MiB folios (the
      // kernel's mmap readahead for huge-page mappings), which any process
      // then maps with one entry per 2 MiB instead of 512. Not on a VM whose
      // host takes free memory back (memory/page_reporting.hpp).
      if (huge) ::madvise(p, n, MADV_HUGEPAGE);
      f.mapping = std::shared_ptr<void>(p, [n](void* q) { unmap_later(q, n); });  // off the thread dropping the last view
    }
    return f.mapping;
  }
  file open_file(std::string path) {
    file f;
    f.path = std::move(path);
    f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) throw io_error(fmt::format("cannot open: {}", std::strerror(errno)), {f.path}, errno);
    counters_.files_opened.fetch_add(1, std::memory_order_relaxed);
    struct stat st{};
    if (::fstat(f.fd, &st) == 0) f.size = static_cast<std::uint64_t>(st.st_size);
#ifdef STATX_DIOALIGN
    struct statx sx{};
    if (::statx(f.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align) {
      f.align = std::max(sx.stx_dio_mem_align, sx.stx_dio_offset_align);
    }
#endif
    if (mode_ != io_mode::buffered) {
      f.direct_fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (f.direct_fd < 0 && mode_ == io_mode::direct) {
        const int e = errno;
        ::close(f.fd);
        throw io_error(fmt::format("cannot open with O_DIRECT: {}", std::strerror(e)), {f.path}, e);
      }
    }
    return f;
  }
  void close_all() noexcept {
    for (auto& f : files_) {
      if (f.fd >= 0) ::close(f.fd);
      if (f.direct_fd >= 0) ::close(f.direct_fd);
    }
    files_.clear();
  }

  uring_context* ring_;
  io_mode mode_;
  bool punt_buffered_;
  bool maps_uncached_ = false;
  bool populate_cached_;
  std::vector<file> files_;
  io_counters counters_;
  std::atomic<std::uint64_t> counters_direct_{0};
  std::atomic<std::uint64_t> counters_buffered_{0};
  std::atomic<std::uint64_t> mapped_bytes_{0};
  std::atomic<std::uint64_t> inline_maps_{0};
  std::atomic<std::uint64_t> unpopulated_maps_{0};
  std::mutex map_mu_;
};

static_assert(source<file_source>);

}  // namespace sluice::inline v0
