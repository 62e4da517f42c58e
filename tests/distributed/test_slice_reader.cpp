// tests for <sluice/distributed/slice_reader.hpp>: where a distributed load's
// reads go, straight into their destinations or through a staging slot.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/core/run.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/distributed/slice_reader.hpp>
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
// Drops the file's pages from the page cache (clean pages only: written back first).
void drop(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::fdatasync(fd) == 0);
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
}
void warm(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> b(1 << 20);
  while (f.read(b.data(), static_cast<std::streamsize>(b.size())) || f.gcount() > 0) {
  }
}
tensor_ref at(const std::string& name, std::uint64_t offset, std::uint64_t size) {
  tensor_ref t;
  t.name = name;
  t.shard = 0;
  t.offset = offset;
  t.size = size;
  return t;
}
}  // namespace

TEST_CASE("a slice reader reads unaligned extents of uncached bytes through slots with O_DIRECT, cached ones straight in",
          "[distributed][slice_reader]") {
  // A distributed load's destinations (window buffers, the node window, the
  // shared segment) lie wherever its layout put them, and a tensor's bytes
  // wherever the safetensors header put them: neither aligned for O_DIRECT.
  // A read straight into such a destination is a buffered read (the kernel's
  // copy and a page-cache page for every 4 KiB); through a slot it is widened
  // to the alignment, read O_DIRECT, and copied out once.
  sluice_test::scratch_dir dir;
  const auto data = pattern((3 << 20) + 1000);
  const auto path = dir.path / "f";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  const std::vector<tensor_ref> ts{at("a", 100, (1 << 20) + 7), at("b", 100 + (1 << 20) + 7, (1 << 20) + 333),
                                   at("c", (2 << 20) + (512 << 10), 256 << 10)};
  asio::io_context ioc;
  uring_context ring(ioc);
  auto owned = std::make_unique<file_source>(ring, std::vector<std::string>{path.string()}, io_mode::automatic);
  file_source* src = owned.get();
  if (src->direct_alignment(0) == 0) {
    WARN("O_DIRECT not supported by this file system: every read is buffered");
    return;
  }
  load_options opt;
  opt.staging_budget = 8 << 20;
  opt.max_read = 1 << 20;
  slice_reader reader(any_source::wrap(std::move(owned), 4), opt);
  // Destinations: a and b one byte past an alignment, c aligned (a staging slot's memory).
  staging_pool aligned({.budget = 1 << 20, .slot_size = 1 << 20});
  auto slot = *aligned.try_acquire();
  auto read_all = [&] {
    std::vector<std::byte> dst((3 << 20) + 1);
    planned_reads reads{{&ts[0], 0, ts[0].size, std::span(dst).subspan(1, ts[0].size)},
                        {&ts[1], 0, ts[1].size, std::span(dst).subspan(1 + ts[0].size, ts[1].size)},
                        {&ts[2], 0, ts[2].size, slot.bytes().first(ts[2].size)}};
    run_blocking(ioc, reader.read(reads));
    REQUIRE(std::memcmp(dst.data() + 1, data.data() + 100, ts[0].size + ts[1].size) == 0);
    REQUIRE(std::memcmp(slot.bytes().data(), data.data() + ts[2].offset, ts[2].size) == 0);
  };

  drop(path);
  if (src->cached(0, 0, 4096)) {
    WARN("the page cache kept the file: nothing to tell apart");
    return;
  }
  read_all();
  CHECK(reader.realigned() == 2);         // a and b through slots; c straight in
  CHECK(src->buffered_reads() == 0);      // every read past the page cache
  CHECK(src->direct_reads() >= 2);

  // Cached: read straight into the destinations (a buffered read is then the one copy).
  warm(path);
  if (!src->cached(0, 0, data.size())) {
    WARN("cachestat(2) unavailable (Linux < 6.5), or the file left the page cache: no cached pass");
    return;
  }
  const auto direct = src->direct_reads();
  read_all();
  CHECK(reader.realigned() == 2);
  CHECK(src->buffered_reads() > 0);
  CHECK(src->direct_reads() == direct);
}

TEST_CASE("a slice reader over a buffered source reads every extent straight into its destination",
          "[distributed][slice_reader]") {
  // io_mode::buffered (a node whose ranks take bytes from its page cache):
  // nothing bypasses the page cache, so nothing is staged for alignment.
  sluice_test::scratch_dir dir;
  const auto data = pattern(2 << 20);
  const auto path = dir.path / "f";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  const auto t = at("a", 3, (1 << 20) + 5);
  asio::io_context ioc;
  uring_context ring(ioc);
  load_options opt;
  opt.staging_budget = 8 << 20;
  opt.max_read = 1 << 20;
  slice_reader reader(any_source::wrap(std::make_unique<file_source>(ring, std::vector<std::string>{path.string()},
                                                                     io_mode::buffered), 4),
                      opt);
  drop(path);
  std::vector<std::byte> dst(t.size + 1);
  run_blocking(ioc, reader.read({{&t, 0, t.size, std::span(dst).subspan(1)}}));
  REQUIRE(std::memcmp(dst.data() + 1, data.data() + 3, t.size) == 0);
  REQUIRE(reader.realigned() == 0);
}

TEST_CASE("a slice reader reads extents other ranks take through the page cache, the others past it", "[distributed][slice_reader]") {
  // A node whose ranks take bytes from its page cache: what they take must
  // land there (via_page_cache), whatever its alignment; what one rank alone
  // reads may bypass it.
  sluice_test::scratch_dir dir;
  const auto data = pattern(4 << 20);
  const auto path = dir.path / "f";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  // Both aligned, so that only via_page_cache tells them apart.
  const std::vector<tensor_ref> ts{at("shared", 0, 1 << 20), at("own", 2 << 20, 1 << 20)};
  asio::io_context ioc;
  uring_context ring(ioc);
  auto owned = std::make_unique<file_source>(ring, std::vector<std::string>{path.string()}, io_mode::automatic);
  file_source* src = owned.get();
  if (src->direct_alignment(0) == 0) {
    WARN("O_DIRECT not supported by this file system: every read is buffered");
    return;
  }
  load_options opt;
  opt.staging_budget = 8 << 20;
  opt.max_read = 1 << 20;
  slice_reader reader(any_source::wrap(std::move(owned), 4), opt);
  drop(path);
  if (src->cached(0, 0, 4096)) {
    WARN("the page cache kept the file: nothing to tell apart");
    return;
  }
  staging_pool mem({.budget = 2 << 20, .slot_size = 1 << 20});
  auto a = *mem.try_acquire(), b = *mem.try_acquire();
  planned_reads reads{{&ts[0], 0, ts[0].size, a.bytes(), false, true}, {&ts[1], 0, ts[1].size, b.bytes()}};
  run_blocking(ioc, reader.read(reads));
  REQUIRE(std::memcmp(a.bytes().data(), data.data(), 1 << 20) == 0);
  REQUIRE(std::memcmp(b.bytes().data(), data.data() + (2 << 20), 1 << 20) == 0);
  CHECK(src->buffered_reads() == 1);
  CHECK(src->direct_reads() == 1);
  CHECK(reader.realigned() == 0);
  CHECK(src->cached(0, 0, 1 << 20));          // there for the node's other ranks
  CHECK_FALSE(src->cached(0, 2 << 20, 4096));  // never cached: read past the page cache
}

