// Tests for include/sluice/core/run.hpp: run_blocking runs a task from a
// plain thread, and refuses to run from inside one (it would block the
// io_context's thread under every coroutine on it).
#include <catch2/catch.hpp>

#include <string>

#include <boost/asio/io_context.hpp>

#include <sluice/core/run.hpp>
#include <sluice/error.hpp>

using namespace sluice;

namespace {
task<int> forty_two() { co_return 42; }

// A coroutine that (wrongly) blocks on another task instead of awaiting it.
task<int> blocks_inside() { co_return run_blocking(forty_two()); }

task<int> awaits_inside() { co_return co_await forty_two() + 1; }
}  // namespace

TEST_CASE("run_blocking runs tasks one after another on one io_context from a plain thread", "[core][run]") {
  asio::io_context ioc{1};
  CHECK(run_blocking(ioc, forty_two()) == 42);
  CHECK(run_blocking(ioc, awaits_inside()) == 43);
  CHECK(run_blocking(forty_two()) == 42);
}

TEST_CASE("run_blocking called from a coroutine throws usage_error instead of blocking its thread", "[core][run]") {
  asio::io_context ioc{1};
  try {
    (void)run_blocking(ioc, blocks_inside());
    FAIL("a nested run_blocking ran");
  } catch (const usage_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("co_await the task instead"));
  }
  // The thread is a plain one again afterwards.
  CHECK(run_blocking(ioc, forty_two()) == 42);
}

TEST_CASE("run_blocking refuses to nest on the helper threads of a multi-threaded run too", "[core][run]") {
  asio::io_context ioc{2};
  CHECK_THROWS_AS(run_blocking(ioc, blocks_inside(), 2), usage_error);
}
