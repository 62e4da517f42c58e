// tests for <sluice/core/uring.hpp> and <sluice/source/file_source.hpp>
#include <utility>

#include <fcntl.h>
#include <dlfcn.h>
#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include <sluice/memory/page_reporting.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/source/file_source.hpp>

#include "support/coro.hpp"
#include "support/files.hpp"
#include "support/pages.hpp"

using namespace sluice;
using sluice_test::present_pages;
namespace asio = boost::asio;

namespace {
using sluice_test::pattern;
using sluice_test::write_file;

task<void> read_into(file_source& src, std::uint64_t off, std::span<std::byte> dst, std::size_t* got) {
  *got = co_await src.read_at(0, off, dst);
}
task<void> map_into(file_source& src, std::uint64_t off, std::uint64_t len, lease* out) {
  *out = co_await src.map(0, off, len);
}
// Writes `v` to `p`; returns `p`.
std::filesystem::path written(std::filesystem::path p, const std::vector<std::byte>& v) {
  write_file(p, v);
  return p;
}
// A scratch file of `n` pattern bytes and a buffered source over it on a
// ring of its own: the map tests' setup. `populate`: whether the source maps
// a cached view's pages in (file_source's last argument).
struct buffered_file {
  explicit buffered_file(std::size_t n, bool populate = true)
      : data(pattern(n)), path(written(dir.path / "f", data)), src(ring, {path.string()}, io_mode::buffered, true, populate) {}
  sluice_test::scratch_dir dir;
  std::vector<std::byte> data;
  std::filesystem::path path;
  asio::io_context ioc;
  uring_context ring{ioc};
  file_source src;
};

// Runs src.map(0, off, len) on `ioc` to completion; rethrows its error.
lease map_range(asio::io_context& ioc, file_source& src, std::uint64_t off, std::uint64_t len) {
  lease view;
  std::exception_ptr failure;
  asio::co_spawn(ioc, map_into(src, off, len, &view), [&failure](std::exception_ptr e) { failure = e; });
  ioc.restart();
  ioc.run();
  if (failure) std::rethrow_exception(failure);
  return view;
}
}  // namespace

TEST_CASE("many reads beyond the ring's size complete, each exactly once", "[core][uring][concurrent]") {
  sluice_test::scratch_dir dir;
  const auto data = pattern(1 << 20);
  write_file(dir.path / "f", data);
  asio::io_context ioc;
  uring_context ring(ioc, {.entries = 4});
  const bool punt = GENERATE(true, false);  // io-wq workers, or inline in the submitter
  file_source src(ring, {(dir.path / "f").string()}, io_mode::buffered, punt);
  constexpr int n = 200;
  std::vector<std::vector<std::byte>> bufs(n, std::vector<std::byte>(4096));
  std::vector<std::size_t> got(n, 0);
  int completions = 0;
  for (int i = 0; i < n; ++i)
    asio::co_spawn(ioc, read_into(src, static_cast<std::uint64_t>(i) * 4096, bufs[static_cast<std::size_t>(i)], &got[static_cast<std::size_t>(i)]),
                   [&](std::exception_ptr e) {
                     if (e) std::rethrow_exception(e);
                     ++completions;
                   });
  ioc.run();
  REQUIRE(completions == n);
  for (int i = 0; i < n; ++i) {
    REQUIRE(got[static_cast<std::size_t>(i)] == 4096);
    REQUIRE(std::memcmp(bufs[static_cast<std::size_t>(i)].data(), data.data() + i * 4096, 4096) == 0);
  }
}

TEST_CASE("a read at the end of a file is short, and past it returns 0", "[core][uring]") {
  sluice_test::scratch_dir dir;
  write_file(dir.path / "f", pattern(5000));
  asio::io_context ioc;
  uring_context ring(ioc);
  file_source src(ring, {(dir.path / "f").string()});
  std::vector<std::byte> buf(4096);
  std::size_t a = 0, b = 0;
  asio::co_spawn(ioc, read_into(src, 4096, buf, &a), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  asio::co_spawn(ioc, read_into(src, 8192, buf, &b), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  ioc.run();
  REQUIRE(a == 5000 - 4096);
  REQUIRE(b == 0);
}

TEST_CASE("aligned reads into registered staging memory use O_DIRECT and return the file's bytes", "[core][uring]") {
  sluice_test::scratch_dir dir;
  const auto data = pattern(3 << 20);
  write_file(dir.path / "f", data);
  asio::io_context ioc;
  staging_pool pool({.budget = 2 << 20, .slot_size = 1 << 20});
  uring_context ring(ioc);
  ring.register_buffers(pool.region(), pool.slot_size());  // may be refused without CAP_IPC_LOCK: reads still work
  // io_mode::direct: the file was just written, so automatic mode would read it from the page cache.
  file_source src(ring, {(dir.path / "f").string()}, io_mode::direct);
  auto slot = *pool.try_acquire();
  std::size_t got = 0;
  asio::co_spawn(ioc, read_into(src, 1 << 20, slot.bytes(), &got), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  ioc.run();
  REQUIRE(got == (1u << 20));
  REQUIRE(std::memcmp(slot.bytes().data(), data.data() + (1 << 20), 1 << 20) == 0);
  if (src.direct_alignment(0) == 0) WARN("O_DIRECT not supported by this file system: the buffered path was used");
}

TEST_CASE("automatic mode reads a range in the page cache buffered and a range not in it with O_DIRECT", "[core][uring]") {
  sluice_test::scratch_dir dir;
  const auto data = pattern(2 << 20);
  const auto path = dir.path / "f";
  write_file(path, data);
  asio::io_context ioc;
  staging_pool pool({.budget = 2 << 20, .slot_size = 1 << 20});
  uring_context ring(ioc);
  file_source src(ring, {path.string()}, io_mode::automatic);
  if (src.direct_alignment(0) == 0) {
    WARN("O_DIRECT not supported by this file system: nothing to choose");
    return;
  }
  auto slot = *pool.try_acquire();
  auto read = [&](std::uint64_t off) {
    std::size_t got = 0;
    asio::co_spawn(ioc, read_into(src, off, slot.bytes(), &got), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
    ioc.restart();
    ioc.run();
    REQUIRE(got == (1u << 20));
    REQUIRE(std::memcmp(slot.bytes().data(), data.data() + off, 1 << 20) == 0);
  };
  read(0);  // just written: in the page cache
  if (src.direct_reads() == 1) {
    WARN("cachestat(2) unavailable (Linux < 6.5): automatic mode always reads O_DIRECT");
    return;
  }
  CHECK(src.buffered_reads() == 1);
  CHECK(src.direct_reads() == 0);
  sluice_test::drop_pages(path);
  read(1 << 20);
  CHECK(src.direct_reads() == 1);
  CHECK(src.buffered_reads() == 1);
  {
    std::ifstream warm(path, std::ios::binary);  // back into the page cache
    std::vector<char> sink(data.size());
    warm.read(sink.data(), static_cast<std::streamsize>(sink.size()));
  }
  read(1 << 20);
  CHECK(src.buffered_reads() == 2);
  CHECK(src.direct_reads() == 1);
}

TEST_CASE("opening a missing file names it", "[core][uring]") {
  asio::io_context ioc;
  uring_context ring(ioc);
  try {
    file_source src(ring, {"/nonexistent/sluice/shard.safetensors"});
    FAIL("no error");
  } catch (const io_error& e) {
    REQUIRE(e.file() == "/nonexistent/sluice/shard.safetensors");
  }
}

TEST_CASE("map hands out a range as a writable view of the page cache that outlives the source", "[core][uring][map]") {
  sluice_test::scratch_dir dir;
  const auto data = pattern((3 << 20) + 123);
  const auto path = dir.path / "f";
  write_file(path, data);
  asio::io_context ioc;
  lease view;
  {
    uring_context ring(ioc);
    file_source src(ring, {path.string()}, io_mode::buffered);
    REQUIRE(src.can_map(0, 5, 1 << 20));
    REQUIRE_FALSE(src.can_map(0, data.size() - 10, 11));  // past the end: read, and fail there, instead
    view = map_range(ioc, src, 4097, (2 << 20) + 100);    // neither end on a page boundary
    REQUIRE(src.mapped_bytes() == (2 << 20) + 100);
    REQUIRE(src.counters().bytes_read == (2 << 20) + 100);
  }
  REQUIRE(view.bytes().size() == (2 << 20) + 100);
  REQUIRE(std::memcmp(view.bytes().data(), data.data() + 4097, view.bytes().size()) == 0);
  view.bytes()[0] = std::byte{0x5a};  // copy on write: the file keeps its bytes
  std::ifstream f(path, std::ios::binary);
  f.seekg(4097);
  char c = 0;
  f.read(&c, 1);
  REQUIRE(static_cast<std::byte>(c) == data[4097]);
}

// The VmFlags line of the mapping holding `p` in /proc/self/smaps ("rd mr ...").
static std::string vma_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) inside = lo <= at && at < hi;
    if (inside && line.starts_with("VmFlags:")) return line.substr(8) + " ";
  }
  return {};
}

// A view's pages come from disk in 2 MiB folios where the file system makes
// them (mmap readahead in a huge-page mapping), which every later view maps
// with one entry per 2 MiB: the flag is what sluice controls, the folio
// sizes are the kernel's. It asks unless the machine hands free memory to a
// host (memory/page_reporting.hpp); ctest runs this case three times:
// SLUICE_FILE_HUGEPAGES unset, on and off (tests/stages/CMakeLists.txt).
TEST_CASE("a file's mapping asks for huge pages unless this machine reports free memory to a host", "[core][uring][map]") {
  buffered_file f(6 << 20);
  const auto view = map_range(f.ioc, f.src, 0, f.data.size());
  const auto flags = vma_flags(view.bytes().data());
  const char* setting = std::getenv("SLUICE_FILE_HUGEPAGES");
  const bool expected = setting ? std::string_view(setting) == "on" : !reports_free_memory();
  INFO("VmFlags:" << flags << "; SLUICE_FILE_HUGEPAGES " << (setting ? setting : "unset") << "; reports free memory "
                  << reports_free_memory());
  REQUIRE_FALSE(flags.empty());
  REQUIRE(file_mapping_huge_pages() == expected);
  REQUIRE((flags.find(" hg ") != std::string::npos) == expected);
  REQUIRE(std::memcmp(view.bytes().data(), f.data.data(), f.data.size()) == 0);
}

TEST_CASE("map fails with truncated_error naming the file and bytes when the file was cut after it was opened", "[core][uring][map][errors]") {
  const bool populate = GENERATE(true, false);  // a source that leaves cached views to their consumers checks too
  buffered_file f(4 << 20, populate);
  std::filesystem::resize_file(f.path, 1 << 20);  // the source saw 4 MiB
  try {
    (void)map_range(f.ioc, f.src, 2 << 20, 1 << 20);
    FAIL("no error");
  } catch (const truncated_error& e) {
    REQUIRE(e.file() == f.path.string());
    REQUIRE(e.range() == byte_range{2 << 20, 3 << 20});
  }
  REQUIRE(f.src.mapped_bytes() == 0);
}

TEST_CASE("io_mode::direct never maps, automatic maps what is cached", "[core][uring][map]") {
  sluice_test::scratch_dir dir;
  const auto path = dir.path / "f";
  write_file(path, pattern(1 << 20));
  asio::io_context ioc;
  uring_context ring(ioc);
  file_source automatic(ring, {path.string()}, io_mode::automatic);
  if (automatic.direct_alignment(0) != 0) {  // a file system with O_DIRECT
    file_source direct(ring, {path.string()}, io_mode::direct);
    REQUIRE_FALSE(direct.can_map(0, 0, 1 << 20));
  }
  // Just written, so in the page cache; drop it (clean pages only) and it is not.
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const bool cached = automatic.can_map(0, 0, 1 << 20);
  REQUIRE(::fdatasync(fd) == 0);
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
  if (!cached) {
    WARN("cachestat(2) unavailable (Linux < 6.5): automatic mode never maps");
    return;
  }
  REQUIRE_FALSE(automatic.can_map(0, 0, 1 << 20));
}

namespace {
// Opens `path` (of `n` bytes) and reads all of it: every page in the page
// cache, written back (clean pages: posix_fadvise can drop them). The caller closes it.
int open_cached(const std::filesystem::path& path, std::size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::fdatasync(fd) == 0);
  std::vector<char> buf(n);
  REQUIRE(::pread(fd, buf.data(), n, 0) == static_cast<ssize_t>(n));
  return fd;
}
}  // namespace

TEST_CASE("cached says whether every page of a range is in the page cache, view maps a range without mapping it in", "[core][uring][map]") {
  buffered_file f((2 << 20) + 777);
  const int fd = open_cached(f.path, f.data.size());
  std::vector<char> buf(4096);
  if (!f.src.cached(0, 0, f.data.size())) {
    ::close(fd);
    WARN("cachestat(2) unavailable (Linux < 6.5): nothing counts as cached");
    return;
  }
  REQUIRE_FALSE(f.src.cached(0, 0, f.data.size() + 1));  // past the end
  // Dropped (clean pages), then its first page read again (and what the
  // kernel reads ahead with it, far less than the file): that page is
  // cached, the whole range is not.
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  REQUIRE_FALSE(f.src.cached(0, 0, 4096));
  REQUIRE(::pread(fd, buf.data(), 4096, 0) == 4096);
  REQUIRE(f.src.cached(0, 0, 4096));
  REQUIRE(f.src.cached(0, 100, 200));
  REQUIRE_FALSE(f.src.cached(0, 0, f.data.size()));

  // A view: the file's bytes, not counted as read, no page mapped in until touched.
  lease v = f.src.view(0, 4097, (1 << 20) + 10);
  REQUIRE(v.bytes().size() == (1 << 20) + 10);
  REQUIRE(f.src.counters().bytes_read == 0);
  REQUIRE(f.src.mapped_bytes() == 0);
  REQUIRE(present_pages(v.bytes()) == 0);
  REQUIRE(std::memcmp(v.bytes().data(), f.data.data() + 4097, v.bytes().size()) == 0);
  REQUIRE(present_pages(v.bytes()) > 0);  // touched: in now
  // map, on the same mapping, maps its pages in.
  const lease m = map_range(f.ioc, f.src, 0, 4096);
  REQUIRE(present_pages(m.bytes()) == 1);
  ::close(fd);
  try {
    (void)f.src.view(0, f.data.size() - 10, 11);
    FAIL("no error");
  } catch (const truncated_error& e) {
    REQUIRE(e.file() == f.path.string());
    REQUIRE(e.range() == byte_range{f.data.size() - 10, f.data.size() + 1});
  }
}

TEST_CASE("map maps a small range whose every page is cached on the calling thread, any other through io-wq, every page in either way",
          "[core][uring][map]") {
  const std::uint64_t limit = file_source::inline_populate_max;
  buffered_file f(static_cast<std::size_t>(limit + (4 << 20)));
  const int fd = open_cached(f.path, f.data.size());
  if (!f.src.cached(0, 0, f.data.size())) {
    ::close(fd);
    WARN("cachestat(2) unavailable (Linux < 6.5): nothing counts as cached, every map goes through io-wq");
    return;
  }
  const auto check = [&](const lease& v, std::uint64_t off) {
    REQUIRE(present_pages(v.bytes()) == (off + v.bytes().size() + 4095) / 4096 - off / 4096);
    REQUIRE(std::memcmp(v.bytes().data(), f.data.data() + off, v.bytes().size()) == 0);
  };
  const lease small = map_range(f.ioc, f.src, 4097, (1 << 20) + 3);  // cached, small: here
  CHECK(f.src.inline_maps() == 1);
  check(small, 4097);
  const lease large = map_range(f.ioc, f.src, 0, limit + (2 << 20));  // cached, larger than the limit: io-wq
  CHECK(f.src.inline_maps() == 1);
  check(large, 0);
  // Dropped (clean pages): a small range that is not cached goes through io-wq too.
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
  const std::uint64_t off = limit + (3 << 20);
  REQUIRE_FALSE(f.src.cached(0, off, 1 << 20));
  const lease cold = map_range(f.ioc, f.src, off, 1 << 20);
  CHECK(f.src.inline_maps() == 1);
  check(cold, off);
  CHECK(f.src.mapped_bytes() == small.bytes().size() + large.bytes().size() + cold.bytes().size());
}

TEST_CASE("a source that does not populate cached views leaves their pages to the consumer, and still maps in what is not cached",
          "[core][uring][map]") {
  const std::uint64_t limit = file_source::inline_populate_max;
  buffered_file f(static_cast<std::size_t>(limit + (8 << 20)), false);
  const int fd = open_cached(f.path, f.data.size());
  if (!f.src.cached(0, 0, f.data.size())) {
    ::close(fd);
    WARN("cachestat(2) unavailable (Linux < 6.5): nothing counts as cached, every view is mapped in");
    return;
  }
  // Cached, small and larger than the inline limit: no page mapped in, the file's bytes.
  const lease small = map_range(f.ioc, f.src, 4097, (1 << 20) + 3);
  const lease large = map_range(f.ioc, f.src, 2 << 20, limit + (2 << 20));
  CHECK(f.src.unpopulated_maps() == 2);
  CHECK(f.src.inline_maps() == 0);
  REQUIRE(present_pages(small.bytes()) == 0);
  REQUIRE(present_pages(large.bytes()) == 0);
  REQUIRE(std::memcmp(small.bytes().data(), f.data.data() + 4097, small.bytes().size()) == 0);
  REQUIRE(std::memcmp(large.bytes().data(), f.data.data() + (2 << 20), large.bytes().size()) == 0);
  REQUIRE(present_pages(large.bytes()) == sluice_test::spanned_pages(large.bytes()));  // the consumer's touches map them
  // Dropped (clean pages, none of them mapped): a range that is not cached is
  // mapped in all the same, since that is its read.
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
  const std::uint64_t off = limit + (5 << 20);
  REQUIRE_FALSE(f.src.cached(0, off, 1 << 20));
  const lease cold = map_range(f.ioc, f.src, off, 1 << 20);
  CHECK(f.src.unpopulated_maps() == 2);
  REQUIRE(present_pages(cold.bytes()) == sluice_test::spanned_pages(cold.bytes()));
  REQUIRE(std::memcmp(cold.bytes().data(), f.data.data() + off, cold.bytes().size()) == 0);
  CHECK(f.src.mapped_bytes() == small.bytes().size() + large.bytes().size() + cold.bytes().size());
}

// io_uring_submit_and_wait, as this executable sees it: the real one, unless
// a test asks for EINTR first (the error io_uring_enter gives when a signal
// arrives during the wait: a Ctrl-C in Python). The definition here
// interposes liburing's exported one for this executable only.
namespace {
std::atomic<int> eintr_to_inject{0};
std::atomic<int> eintr_injected{0};
}  // namespace
extern "C" int io_uring_submit_and_wait(struct io_uring* ring, unsigned wait_nr) {
  using real_fn = int (*)(struct io_uring*, unsigned);
  static const auto real = reinterpret_cast<real_fn>(::dlsym(RTLD_NEXT, "io_uring_submit_and_wait"));
  if (eintr_to_inject.load() > 0) {
    eintr_to_inject.fetch_sub(1);
    eintr_injected.fetch_add(1);
    return -EINTR;
  }
  return real(ring, wait_nr);
}

TEST_CASE("teardown waits out signals: every read in flight completes before the context is gone",
          "[core][uring][concurrent]") {
  // Reads of an empty pipe stay in flight until cancelled. The destructor's
  // wait is interrupted (EINTR) three times; it must go on waiting, or reads
  // still in flight would outlive their buffers. Every read's handler must be
  // gone once the destructor returns (a canary counts them): an abandoned
  // read keeps its own.
  constexpr int reads = 32;
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  std::vector<std::byte> buf(reads * 16);
  auto canary = std::make_shared<int>(0);
  {
    asio::io_context ioc;
    uring_context ring(ioc, {.entries = 64});
    for (int i = 0; i < reads; ++i)
      ring.async_read_at(p[0], std::span<std::byte>(buf).subspan(static_cast<std::size_t>(i) * 16, 16), 0,
                         [canary](boost::system::error_code, std::size_t) {});
    ioc.poll();   // submits them
    REQUIRE(canary.use_count() == reads + 1);
    eintr_injected = 0;
    eintr_to_inject = 3;
  }
  CHECK(eintr_injected.load() == 3);
  CHECK(canary.use_count() == 1);   // every handler destroyed: no read was abandoned
  ::close(p[0]);
  ::close(p[1]);
}
