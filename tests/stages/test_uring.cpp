// tests for <sluice/core/uring.hpp> and <sluice/source/file_source.hpp>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <numeric>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include <sluice/core/staging_pool.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/source/file_source.hpp>

#include "support/coro.hpp"

using namespace sluice;
namespace asio = boost::asio;

namespace {
std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  return v;
}
void write_file(const std::filesystem::path& p, const std::vector<std::byte>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
}

task<void> read_into(file_source& src, std::uint64_t off, std::span<std::byte> dst, std::size_t* got) {
  *got = co_await src.read_at(0, off, dst);
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
  // Drop the file from the page cache (clean pages only: write back first; the
  // whole file, as the kernel keeps a large folio when only part of it is advised).
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::fdatasync(fd) == 0);
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
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
