// tests for <sluice/memory/memory_cache.hpp>: pools and buffers kept between loads.
#include <utility>

#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/memory/memory_cache.hpp>

using namespace sluice;

TEST_CASE("a dropped buffer is handed out again for the same size or one up to half its size", "[core][memory_cache]") {
  memory_cache c;
  c.reserve(64 << 20);
  std::size_t cap = 0;
  auto a = c.buffer(3 << 20, &cap);
  CHECK(cap == 4u << 20);  // 2 MiB pages from 2 MiB up
  CHECK(reinterpret_cast<std::uintptr_t>(a.bytes().data()) % (2u << 20) == 0);
  const auto* p = a.bytes().data();
  a.reset();
  CHECK(c.stats().idle_buffer_bytes == 4u << 20);
  auto b = c.buffer(2u << 20 | 1);  // capacity 4 MiB: the idle one fits
  CHECK(b.bytes().data() == p);
  CHECK(b.bytes().size() == (2u << 20 | 1));
  CHECK(c.stats().reused_buffers == 1);
  b.reset();
  auto tiny = c.buffer(4096);  // far smaller: a new one, the idle one stays
  CHECK(tiny.bytes().data() != p);
  CHECK(c.stats().idle_buffer_bytes == 4u << 20);
}

TEST_CASE("idle buffers stay within the capacity, trim and release free them", "[core][memory_cache]") {
  memory_cache c;
  c.reserve(8 << 20);
  std::vector<lease> live;
  for (int i = 0; i < 4; ++i) live.push_back(c.buffer(3 << 20));  // 4 MiB each
  live.clear();
  CHECK(c.stats().idle_buffer_bytes == 8u << 20);  // two kept, two freed
  CHECK(c.trim(4 << 20) == 4u << 20);
  CHECK(c.stats().idle_buffer_bytes == 4u << 20);
  c.release();
  CHECK(c.stats().idle_buffer_bytes == 0);
  auto l = c.buffer(1 << 20);
  l.reset();  // capacity is 0 after release: freed, not kept
  CHECK(c.stats().idle_buffer_bytes == 0);
}

TEST_CASE("the idle pool is reused only when its shape matches and every slot is free", "[core][memory_cache]") {
  memory_cache c;
  const staging_options o{.budget = 1 << 20, .slot_size = 256 << 10};
  auto p = c.pool(o);
  auto held = p->try_acquire();
  c.put_pool(p);
  auto q = c.pool(o);  // a slot is still leased: a new pool
  CHECK(q != p);
  CHECK(c.stats().reused_pools == 0);
  held.reset();
  c.put_pool(p);
  CHECK(c.pool(staging_options{.budget = 2 << 20, .slot_size = 256 << 10}) != p);  // another shape
  c.put_pool(p);
  CHECK(c.pool(o) == p);
  CHECK(c.stats().reused_pools == 1);
}

TEST_CASE("buffers returned from many threads are counted once each", "[core][memory_cache][concurrent]") {
  memory_cache c;
  c.reserve(256 << 20);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto l = c.buffer((64 << 10) * (1 + i % 3));
        l.bytes()[0] = std::byte{1};
      }
    });
  for (auto& t : ts) t.join();
  const auto s = c.stats();
  CHECK(s.idle_buffer_bytes <= 256u << 20);
  CHECK(s.reused_buffers >= 800 - 12);  // each thread holds at most one at a time: few new ones
}
