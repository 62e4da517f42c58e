// tests for <sluice/core/channel.hpp>
#include <utility>

#include <atomic>
#include <thread>
#include <variant>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <catch2/catch.hpp>

#include <sluice/core/channel.hpp>
#include <sluice/error.hpp>

#include "support/coro.hpp"

using namespace sluice;
namespace asio = boost::asio;

namespace {

task<void> produce(channel<int>& ch, int n, std::size_t* max_seen) {
  for (int i = 0; i < n; ++i) {
    co_await ch.send(i);
    *max_seen = std::max(*max_seen, ch.size());
  }
  ch.close();
}

task<std::vector<int>> consume_all(channel<int>& ch) {
  std::vector<int> got;
  while (auto v = co_await ch.receive()) got.push_back(*v);
  co_return got;
}

task<std::vector<int>> pipe_through(std::size_t capacity, int n, std::size_t* max_seen) {
  auto ex = co_await this_executor;
  channel<int> ch{capacity};
  std::exception_ptr failure;
  channel<std::monostate> done{1};
  asio::co_spawn(ex, produce(ch, n, max_seen), [&](std::exception_ptr e) {
    failure = e;
    done.close();
  });
  auto got = co_await consume_all(ch);
  while (co_await done.receive()) {
  }
  if (failure) std::rethrow_exception(failure);
  co_return got;
}

}  // namespace

TEST_CASE("items leave a channel in the order they were sent", "[core][channel]") {
  std::size_t max_seen = 0;
  auto got = sluice_test::run(pipe_through(3, 100, &max_seen));
  REQUIRE(got.size() == 100);
  for (int i = 0; i < 100; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("send suspends while the channel is full", "[core][channel]") {
  std::size_t max_seen = 0;
  (void)sluice_test::run(pipe_through(2, 50, &max_seen));
  REQUIRE(max_seen <= 2);
}

namespace {
task<void> send_n(channel<int>& ch, int n, int* sent) {
  for (int i = 0; i < n; ++i) {
    co_await ch.send(i);
    ++*sent;
  }
}
task<int> full_then_drain() {
  auto ex = co_await this_executor;
  channel<int> ch{2};
  int sent = 0;
  channel<std::monostate> done{1};
  asio::co_spawn(ex, send_n(ch, 5, &sent), [&](std::exception_ptr) { done.close(); });
  // Let the producer run until it blocks.
  for (int i = 0; i < 10; ++i) co_await asio::post(ex, asio::use_awaitable);
  const int blocked_at = sent;
  while (sent < 5 || ch.size() > 0) (void)co_await ch.receive();
  while (co_await done.receive()) {
  }
  co_return blocked_at;
}
}  // namespace

TEST_CASE("a producer stops at the capacity until a receive makes room", "[core][channel]") {
  REQUIRE(sluice_test::run(full_then_drain()) == 2);
}

TEST_CASE("receive returns nullopt once the channel is closed and drained", "[core][channel]") {
  auto t = []() -> task<bool> {
    channel<int> ch{4};
    co_await ch.send(1);
    co_await ch.send(2);
    ch.close();
    auto a = co_await ch.receive();
    auto b = co_await ch.receive();
    auto c = co_await ch.receive();
    co_return a == 1 && b == 2 && !c.has_value();
  };
  REQUIRE(sluice_test::run(t()));
}

namespace {
task<void> wait_receive(channel<int>& ch, bool* threw) {
  try {
    (void)co_await ch.receive();
  } catch (const cancelled_error&) {
    *threw = true;
  }
}
task<bool> abort_wakes() {
  auto ex = co_await this_executor;
  channel<int> ch{1};
  bool threw = false;
  channel<std::monostate> done{1};
  asio::co_spawn(ex, wait_receive(ch, &threw), [&](std::exception_ptr) { done.close(); });
  co_await asio::post(ex, asio::use_awaitable);
  ch.abort(std::make_exception_ptr(cancelled_error()));
  while (co_await done.receive()) {
  }
  bool send_threw = false;
  try {
    co_await ch.send(1);
  } catch (const cancelled_error&) {
    send_threw = true;
  }
  co_return threw && send_threw;
}
}  // namespace

TEST_CASE("abort wakes a waiting receiver and later calls rethrow the reason", "[core][channel]") {
  REQUIRE(sluice_test::run(abort_wakes()));
}

TEST_CASE("sending on a closed channel is an error", "[core][channel]") {
  auto t = []() -> task<void> {
    channel<int> ch{1};
    ch.close();
    co_await ch.send(1);
  };
  REQUIRE_THROWS_AS(sluice_test::run(t()), sluice::error);
}

TEST_CASE("a pipeline on one strand of a 4-thread io_context passes every item once", "[core][channel][concurrent]") {
  asio::io_context ioc{4};
  auto strand = asio::make_strand(ioc);
  std::size_t max_seen = 0;
  std::vector<int> got;
  std::exception_ptr failure;
  asio::co_spawn(strand, pipe_through(2, 1000, &max_seen), [&](std::exception_ptr e, std::vector<int> v) {
    failure = e;
    got = std::move(v);
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { ioc.run(); });
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  REQUIRE(got.size() == 1000);
  REQUIRE(max_seen <= 2);
  for (int i = 0; i < 1000; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == i);
}
