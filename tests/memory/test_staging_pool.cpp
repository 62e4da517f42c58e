// tests for <sluice/memory/staging_pool.hpp> and <sluice/memory/lease.hpp>
#include <utility>

#include <thread>
#include <variant>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>

#include <sluice/core/channel.hpp>
#include <sluice/memory/staging_pool.hpp>

#include "support/coro.hpp"

using namespace sluice;
namespace asio = boost::asio;

TEST_CASE("the budget is cut into whole slots", "[core][staging_pool]") {
  staging_pool pool({.budget = 10 << 20, .slot_size = 4 << 20});
  REQUIRE(pool.slot_count() == 2);
  REQUIRE(pool.slot_size() == (4 << 20));
  REQUIRE(pool.free_count() == 2);
  REQUIRE(reinterpret_cast<std::uintptr_t>(pool.region().data()) % 4096 == 0);
}

TEST_CASE("a budget smaller than one slot is a configuration error", "[core][staging_pool]") {
  REQUIRE_THROWS_AS(staging_pool({.budget = 1 << 20, .slot_size = 4 << 20}), config_error);
}

TEST_CASE("a slot returns to the pool when the last copy of its lease is released", "[core][staging_pool][lease]") {
  staging_pool pool({.budget = 1 << 20, .slot_size = 1 << 20});
  auto a = pool.try_acquire();
  REQUIRE(a);
  REQUIRE(pool.free_count() == 0);
  REQUIRE_FALSE(pool.try_acquire());
  lease copy = *a;
  a->reset();
  REQUIRE(pool.free_count() == 0);
  copy.reset();
  REQUIRE(pool.free_count() == 1);
  REQUIRE(pool.high_water() == 1);
}

namespace {
task<int> acquire_waits(staging_pool& pool) {
  auto ex = co_await this_executor;
  auto first = co_await pool.acquire();
  int order = 0, second_at = -1;
  channel<std::monostate> done{1};
  asio::co_spawn(
      ex,
      [](staging_pool* p, int* ord, int* at) -> task<void> {  // no captures: parameters live in the frame
        auto l = co_await p->acquire();
        *at = ++*ord;
      }(&pool, &order, &second_at),
      [&](std::exception_ptr) { done.close(); });
  for (int i = 0; i < 5; ++i) co_await asio::post(ex, asio::use_awaitable);
  const int before_release = second_at;  // still waiting
  ++order;
  first.reset();  // wakes the waiter
  while (co_await done.receive()) {
  }
  co_return before_release == -1 && second_at == 2 ? 1 : 0;
}
}  // namespace

TEST_CASE("acquire suspends while the budget is spent and resumes on release", "[core][staging_pool]") {
  staging_pool pool({.budget = 1 << 20, .slot_size = 1 << 20});
  REQUIRE(sluice_test::run(acquire_waits(pool)) == 1);
  REQUIRE(pool.free_count() == 1);
}

TEST_CASE("a release from another thread wakes a waiting acquire", "[core][staging_pool][concurrent]") {
  staging_pool pool({.budget = 2 << 20, .slot_size = 1 << 20});
  asio::io_context ioc{1};
  auto held1 = pool.try_acquire();
  auto held2 = pool.try_acquire();
  bool got = false;
  asio::co_spawn(
      ioc, [](staging_pool* p, bool* g) -> task<void> { auto l = co_await p->acquire(); *g = true; }(&pool, &got),
      [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held1->reset();
  });
  ioc.run();
  releaser.join();
  REQUIRE(got);
}

#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("a released slot is poisoned when poisoning is on", "[core][staging_pool]") {
  staging_pool pool({.budget = 1 << 20, .slot_size = 1 << 20, .poison = true});
  auto l = *pool.try_acquire();
  std::byte* p = l.bytes().data();
  std::memset(p, 0x11, 64);
  l.reset();
  REQUIRE(p[0] == poison_byte);
  REQUIRE(p[63] == poison_byte);
}
#endif

TEST_CASE("an owned buffer is aligned and lives while a lease shares it", "[core][lease]") {
  auto l = lease::allocate(10000, 4096);
  REQUIRE(reinterpret_cast<std::uintptr_t>(l.bytes().data()) % 4096 == 0);
  REQUIRE(l.bytes().size() == 10000);
  lease c = l;
  l.reset();
  REQUIRE(c.use_count() == 1);
  c.bytes()[9999] = std::byte{1};
}
