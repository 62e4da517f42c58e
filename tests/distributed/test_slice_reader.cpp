// tests for <sluice/distributed/slice_reader.hpp>: where a distributed load's
// reads go, straight into their destinations or through a staging slot, and
// through the page cache or past it.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/core/run.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/source/file_source.hpp>
#include <sluice/source/page_cache.hpp>

#include "support/coro.hpp"
#include "support/files.hpp"

using namespace sluice;
namespace asio = boost::asio;

namespace {
tensor_ref at(const std::string& name, std::uint64_t offset, std::uint64_t size) {
  tensor_ref t;
  t.name = name;
  t.shard = 0;
  t.offset = offset;
  t.size = size;
  return t;
}

// A scratch file of `n` pattern bytes and a slice reader over a `mode`
// source of it (1 MiB requests; `src` is the source, for its counters).
struct reading {
  sluice_test::scratch_dir dir;
  std::vector<std::byte> data;
  std::filesystem::path path = dir.path / "f";
  asio::io_context ioc;
  uring_context ring{ioc};
  file_source* src = nullptr;
  std::unique_ptr<slice_reader> reader;

  reading(std::size_t n, io_mode mode) : data(sluice_test::pattern(n)) {
    sluice_test::write_file(path, data);
    auto s = std::make_unique<file_source>(ring, std::vector<std::string>{path.string()}, mode);
    src = s.get();
    load_options opt;
    opt.staging_budget = 8 << 20;
    opt.max_read = 1 << 20;
    reader = std::make_unique<slice_reader>(any_source::wrap(std::move(s), 4), opt);
  }
  void read(const planned_reads& reads) { run_blocking(ioc, reader->read(reads)); }
  // Whether this machine can tell O_DIRECT reads from buffered ones here:
  // the file system takes O_DIRECT, and the file's pages left the page cache.
  bool drop_or_warn() {
    if (src->direct_alignment(0) == 0) {
      WARN("O_DIRECT not supported by this file system: every read is buffered");
      return false;
    }
    sluice_test::drop_pages(path);
    if (src->cached(0, 0, 4096)) {
      WARN("the page cache kept the file: nothing to tell apart");
      return false;
    }
    return true;
  }
};
}  // namespace

TEST_CASE("a slice reader reads unaligned extents of uncached bytes through slots with O_DIRECT, cached ones straight in",
          "[distributed][slice_reader]") {
  // A distributed load's destinations (window buffers, the node window, the
  // shared segment) lie wherever its layout put them, and a tensor's bytes
  // wherever the safetensors header put them: neither aligned for O_DIRECT.
  // A read straight into such a destination is a buffered read (the kernel's
  // copy and a page-cache page for every 4 KiB); through a slot it is widened
  // to the alignment, read O_DIRECT, and copied out once.
  reading f((3 << 20) + 1000, io_mode::automatic);
  const std::vector<tensor_ref> ts{at("a", 100, (1 << 20) + 7), at("b", 100 + (1 << 20) + 7, (1 << 20) + 333),
                                   at("c", (2 << 20) + (512 << 10), 256 << 10)};
  // Destinations: a and b one byte past an alignment, c aligned (a staging slot's memory).
  staging_pool aligned({.budget = 1 << 20, .slot_size = 1 << 20});
  auto slot = *aligned.try_acquire();
  auto read_all = [&] {
    std::vector<std::byte> dst((3 << 20) + 1);
    f.read({{&ts[0], 0, ts[0].size, std::span(dst).subspan(1, ts[0].size)},
            {&ts[1], 0, ts[1].size, std::span(dst).subspan(1 + ts[0].size, ts[1].size)},
            {&ts[2], 0, ts[2].size, slot.bytes().first(ts[2].size)}});
    REQUIRE(std::memcmp(dst.data() + 1, f.data.data() + 100, ts[0].size + ts[1].size) == 0);
    REQUIRE(std::memcmp(slot.bytes().data(), f.data.data() + ts[2].offset, ts[2].size) == 0);
  };
  if (!f.drop_or_warn()) return;
  read_all();
  CHECK(f.reader->realigned() == 2);     // a and b through slots; c straight in
  CHECK(f.src->buffered_reads() == 0);   // every read past the page cache
  CHECK(f.src->direct_reads() >= 2);

  // Cached: read straight into the destinations (a buffered read is then the one copy).
  sluice_test::warm_pages(f.path);
  if (!f.src->cached(0, 0, f.data.size())) {
    WARN("cachestat(2) unavailable (Linux < 6.5), or the file left the page cache: no cached pass");
    return;
  }
  const auto direct = f.src->direct_reads();
  read_all();
  CHECK(f.reader->realigned() == 2);
  CHECK(f.src->buffered_reads() > 0);
  CHECK(f.src->direct_reads() == direct);
}

TEST_CASE("a slice reader over a buffered source reads every extent straight into its destination",
          "[distributed][slice_reader]") {
  // io_mode::buffered: nothing bypasses the page cache, so nothing is staged
  // for alignment.
  reading f(2 << 20, io_mode::buffered);
  const auto t = at("a", 3, (1 << 20) + 5);
  sluice_test::drop_pages(f.path);
  std::vector<std::byte> dst(t.size + 1);
  f.read({{&t, 0, t.size, std::span(dst).subspan(1)}});
  REQUIRE(std::memcmp(dst.data() + 1, f.data.data() + 3, t.size) == 0);
  REQUIRE(f.reader->realigned() == 0);
}

TEST_CASE("a slice reader reads extents other ranks take through the page cache, the others past it", "[distributed][slice_reader]") {
  // A node whose ranks take bytes from its page cache: what they take must
  // land there (via_page_cache), whatever its alignment; what one rank alone
  // reads may bypass it.
  reading f(4 << 20, io_mode::automatic);
  // Both aligned, so that only via_page_cache tells them apart.
  const std::vector<tensor_ref> ts{at("shared", 0, 1 << 20), at("own", 2 << 20, 1 << 20)};
  if (!f.drop_or_warn()) return;
  staging_pool mem({.budget = 2 << 20, .slot_size = 1 << 20});
  auto a = *mem.try_acquire(), b = *mem.try_acquire();
  f.read({{&ts[0], 0, ts[0].size, a.bytes(), false, true}, {&ts[1], 0, ts[1].size, b.bytes()}});
  REQUIRE(std::memcmp(a.bytes().data(), f.data.data(), 1 << 20) == 0);
  REQUIRE(std::memcmp(b.bytes().data(), f.data.data() + (2 << 20), 1 << 20) == 0);
  CHECK(f.src->buffered_reads() == 1);
  CHECK(f.src->direct_reads() == 1);
  CHECK(f.reader->realigned() == 0);
  CHECK(f.src->cached(0, 0, 1 << 20));          // there for the node's other ranks
  CHECK_FALSE(f.src->cached(0, 2 << 20, 4096));  // never cached: read past the page cache
}

TEST_CASE("a slice reader stages an unaligned extent only where its source would read the range past the page cache",
          "[distributed][slice_reader]") {
  // The source's rule decides (direct_alignment_at): under io=automatic a
  // range mostly in the page cache is read through it, so a slot would only
  // add a copy; under io=direct the same range is read past it, so it goes
  // through a slot. (A range all cached goes straight in under both: the
  // first test.)
  const auto t = at("a", 100, 8 << 20);  // unaligned in the file
  // Opens the file under `mode` with three quarters of the extent's range in
  // the page cache; false (with a warning) where this machine cannot say.
  auto partly_cached = [&](std::optional<reading>& f, io_mode mode) {
    try {
      f.emplace(12 << 20, mode);
    } catch (const std::exception& e) {  // a file system without O_DIRECT (tmpfs): io=direct refuses it
      WARN("cannot open here under this mode: " << e.what());
      return false;
    }
    if (!f->drop_or_warn()) return false;
    sluice_test::warm_range(f->path, 0, 6 << 20);
    const int fd = ::open(f->path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    const auto in_cache = detail::cached_bytes(fd, t.offset, t.size);
    ::close(fd);
    if (in_cache * 2 < t.size || f->src->cached(0, t.offset, t.size)) {
      WARN("cachestat(2) unavailable, or the page cache did not keep exactly the warmed part: nothing to tell apart");
      return false;
    }
    return true;
  };
  auto read_it = [&](reading& f) {
    std::vector<std::byte> dst(t.size + 1);
    f.read({{&t, 0, t.size, std::span(dst).subspan(1)}});
    REQUIRE(std::memcmp(dst.data() + 1, f.data.data() + t.offset, t.size) == 0);
  };
  SECTION("io=automatic: straight in, one buffered read") {
    std::optional<reading> f;
    if (!partly_cached(f, io_mode::automatic)) return;
    CHECK(f->src->direct_alignment_at(0, t.offset, t.size) == 0);
    CHECK(f->src->direct_alignment_at(0, 8 << 20, 4 << 20) != 0);  // a range not cached
    read_it(*f);
    CHECK(f->reader->realigned() == 0);
    CHECK(f->src->buffered_reads() >= 1);
    CHECK(f->src->direct_reads() == 0);
  }
  SECTION("io=direct: through a slot, O_DIRECT") {
    std::optional<reading> f;
    if (!partly_cached(f, io_mode::direct)) return;
    CHECK(f->src->direct_alignment_at(0, t.offset, t.size) != 0);
    read_it(*f);
    CHECK(f->reader->realigned() == 1);
    CHECK(f->src->buffered_reads() == 0);
    CHECK(f->src->direct_reads() >= 1);
  }
}
