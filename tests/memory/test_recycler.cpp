// tests for <sluice/memory/recycler.hpp> and <sluice/memory/window_buffers.hpp>:
// the one reuse rule, on memory the test counts itself.
#include <atomic>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/memory/recycler.hpp>
#include <sluice/memory/window_buffers.hpp>

using namespace sluice;

namespace {
// Heap memory that counts what it made and freed (the test's own, so a busy
// machine changes nothing).
struct counted {
  std::shared_ptr<std::atomic<long>> made = std::make_shared<std::atomic<long>>(0), freed = std::make_shared<std::atomic<long>>(0);
  std::size_t capacity_for(std::size_t n) const noexcept { return (n + 4095) / 4096 * 4096; }
  void* allocate(std::size_t cap) const {
    ++*made;
    return std::aligned_alloc(4096, cap);
  }
  void free(void* p, std::size_t) const noexcept {
    ++*freed;
    std::free(p);
  }
};
}  // namespace

TEST_CASE("recycler: a buffer comes back when its last lease goes, and serves the next request it holds within 2x",
          "[memory][recycler]") {
  counted m;
  memory::recycler<counted> r(m);
  r.reserve(1 << 20);
  auto a = r.get(10000);  // capacity 12288
  const auto* p = a.bytes().data();
  auto copy = a;
  a.reset();
  CHECK(r.stats().idle_bytes == 0);  // a copy of the lease still holds it
  auto b = r.get(10000);
  CHECK(b.bytes().data() != p);      // so the next request gets other memory
  copy.reset();
  CHECK(r.stats().idle_bytes == 12288);
  auto c = r.get(8000);              // capacity 8192: the idle 12288 holds it, within 2x
  CHECK(c.bytes().data() == p);
  CHECK(c.bytes().size() == 8000);
  CHECK(r.stats().reused == 1);
  c.reset();
  auto tiny = r.get(100);            // 4096: 12288 is more than twice it
  CHECK(tiny.bytes().data() != p);
  auto big = r.get(20000);           // larger than any idle one
  CHECK(big.bytes().data() != p);
  CHECK(*m.made == 4);
  CHECK(r.get(0).bytes().empty());
}

TEST_CASE("recycler: what exceeds the capacity is freed at once, release frees the idle ones and what comes back later",
          "[memory][recycler]") {
  counted m;
  memory::recycler<counted> r(m);
  r.reserve(8192);
  auto a = r.get(8192), b = r.get(4096);
  a.reset();
  CHECK(r.stats().idle_bytes == 8192);
  b.reset();                          // 8192 + 4096 > capacity
  CHECK(*m.freed == 1);
  CHECK(r.stats().live_bytes == 8192);
  auto held = r.get(8192);            // the idle one
  r.release();
  CHECK(r.stats().live_bytes == 8192);  // lent: it stays until let go
  held.reset();
  CHECK(*m.freed == 2);
  CHECK(r.stats().live_bytes == 0);
  CHECK(*m.made == 2);
}

TEST_CASE("recycler: leases let go of on other threads come back once each", "[memory][recycler][concurrent]") {
  counted m;
  {
    memory::recycler<counted> r(m);
    r.reserve(64 * 8192);
    std::vector<std::thread> t;
    for (int k = 0; k < 4; ++k)
      t.emplace_back([&r] {
        for (int i = 0; i < 200; ++i) {
          auto l = r.get(4096 + static_cast<std::size_t>(i % 3) * 1000);
          l.bytes()[0] = std::byte{1};
        }
      });
    for (auto& x : t) x.join();
    CHECK(r.stats().live_bytes == r.stats().idle_bytes);
    CHECK(r.stats().allocations <= 8);  // at most one per thread and size class at once
  }
  CHECK(*m.made == *m.freed);  // the recycler's end frees what it kept
}

TEST_CASE("window_buffers: the next window takes a buffer back once nobody holds it, one a sink holds is not reused",
          "[memory][recycler]") {
  window_buffers w;
  w.reserve(2 * w.capacity_for(1000));
  const auto* first = w.get(1000).bytes().data();
  auto again = w.get(1000);
  CHECK(again.bytes().data() == first);   // released, the same size: reused
  auto other = w.get(1000);               // `again` is held (a sink's view): another buffer
  CHECK(other.bytes().data() != first);
  again.reset();
  other.reset();
  std::set<const std::byte*> seen;
  for (int i = 0; i < 10; ++i) seen.insert(w.get(1000).bytes().data());
  CHECK(seen.size() == 1);                 // windows one after the other: no new memory
  CHECK(w.stats().allocations == 2);
  w.release();
  CHECK(w.stats().live_bytes == 0);
}
