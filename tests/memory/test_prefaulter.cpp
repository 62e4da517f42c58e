// tests for <sluice/memory/prefaulter.hpp>: destinations faulted in from the
// last backwards, nothing written, stopping where the load has reached, when
// asked, or where the kernel declines; no thread for small destinations.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/memory/prefaulter.hpp>

using namespace sluice;

namespace {
const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

// Fresh anonymous memory of the test's own, unmapped at the end.
struct fresh_memory {
  explicit fresh_memory(std::size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<std::byte*>(p);
  }
  ~fresh_memory() { ::munmap(base, size); }
  fresh_memory(const fresh_memory&) = delete;
  fresh_memory& operator=(const fresh_memory&) = delete;
  // Pages of [p, p + n) present in this process's page tables.
  std::size_t resident(std::byte* p, std::size_t n) const {
    std::vector<unsigned char> v((n + page - 1) / page);
    REQUIRE(::mincore(p, n, v.data()) == 0);
    std::size_t k = 0;
    for (auto c : v) k += c & 1;
    return k;
  }
  std::byte* base = nullptr;
  std::size_t size = 0;
};
}  // namespace

TEST_CASE("populate_backwards faults destinations in from the last, writing nothing", "[core][prefaulter]") {
  fresh_memory m(16 << 20);
  // Four destinations of 4 MiB, page-aligned; a marker in the first page of the second.
  std::vector<std::span<std::byte>> dst;
  for (int i = 0; i < 4; ++i) dst.emplace_back(m.base + i * (4 << 20), 4 << 20);
  std::memset(dst[1].data(), 0x5a, 16);
  REQUIRE(m.resident(m.base, m.size) == 1);

  std::atomic<std::size_t> reached{2};  // the load has the first two
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bytes{0};
  prefaulter::populate_backwards(dst, reached, stop, bytes);
  CHECK(bytes == 8u << 20);
  CHECK(m.resident(dst[2].data(), dst[2].size()) == dst[2].size() / page);
  CHECK(m.resident(dst[3].data(), dst[3].size()) == dst[3].size() / page);
  CHECK(m.resident(dst[0].data(), dst[0].size()) == 0);
  CHECK(m.resident(dst[1].data(), dst[1].size()) == 1);  // the marker's page, the test's own write

  reached = 0;
  bytes = 0;
  prefaulter::populate_backwards(dst, reached, stop, bytes);
  CHECK(bytes == 16u << 20);  // present pages count again: populating them is a walk
  CHECK(m.resident(m.base, m.size) == m.size / page);
  // Nothing written: the marker stands, and every other byte is still zero.
  for (std::size_t i = 0; i < 16; ++i) CHECK(dst[1][i] == std::byte{0x5a});
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < m.size; ++i) nonzero += m.base[i] != std::byte{0};
  CHECK(nonzero == 16);

  stop = true;
  bytes = 0;
  prefaulter::populate_backwards(dst, reached, stop, bytes);
  CHECK(bytes == 0);
}

TEST_CASE("populate_backwards rounds unaligned destinations out to whole pages", "[core][prefaulter]") {
  fresh_memory m(8 << 20);
  // One destination starting mid-page and ending mid-page: every page it touches.
  std::vector<std::span<std::byte>> dst{{m.base + 100, (3 << 20) + 5}};
  std::atomic<std::size_t> reached{0};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bytes{0};
  prefaulter::populate_backwards(dst, reached, stop, bytes);
  const std::size_t pages = ((3u << 20) + 105 + page - 1) / page;
  CHECK(bytes == pages * page);
  CHECK(m.resident(m.base, m.size) == pages);
}

TEST_CASE("populate_backwards stops quietly where the kernel declines", "[core][prefaulter][errors]") {
  fresh_memory m(12 << 20);
  std::vector<std::span<std::byte>> dst;
  for (int i = 0; i < 3; ++i) dst.emplace_back(m.base + i * (4 << 20), 4 << 20);
  // The middle destination cannot be written: populating it fails, and the
  // first is not tried (the reads would fail there with their own error).
  REQUIRE(::mprotect(dst[1].data(), dst[1].size(), PROT_READ) == 0);
  std::atomic<std::size_t> reached{0};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bytes{0};
  prefaulter::populate_backwards(dst, reached, stop, bytes);
  CHECK(bytes == 4u << 20);
  CHECK(m.resident(dst[2].data(), dst[2].size()) == dst[2].size() / page);
  CHECK(m.resident(dst[0].data(), dst[0].size()) == 0);
}

TEST_CASE("a prefaulter starts a thread only for destinations worth one, and stops when asked", "[core][prefaulter]") {
  fresh_memory m(8 << 20);
  {
    prefaulter small({{m.base, 1 << 20}});  // under default_min_bytes
    CHECK_FALSE(small.started());
    small.stop();
    CHECK(small.bytes() == 0);
  }
  CHECK(m.resident(m.base, m.size) == 0);
  {
    prefaulter none({}, 0);
    CHECK_FALSE(none.started());
  }
  std::uint64_t done = 0;
  {
    prefaulter all({{m.base, 4 << 20}, {m.base + (4 << 20), 4 << 20}}, 1);
    CHECK(all.started());
    // Waits (up to 30 s, a bound for a busy machine, not a speed) for it to finish.
    for (int i = 0; i < 3000 && all.bytes() < (8u << 20); ++i) ::usleep(10000);
    all.stop();
    done = all.bytes();
  }
  CHECK(done == 8u << 20);
  CHECK(m.resident(m.base, m.size) == m.size / page);
  {
    // Told at once that the load has reached everything: stops at its next
    // piece, having faulted in at most the one it was on.
    fresh_memory big(64 << 20);
    prefaulter late({{big.base, 64 << 20}}, 1);
    late.reached(1);
    late.stop();
    CHECK(late.bytes() <= (64u << 20));
    CHECK(big.resident(big.base, big.size) * page == late.bytes());
  }
}
