// tests for <sluice/stages/pipeline.hpp>: `|`, run_pipeline, and the
// completions of the coroutines a runner spawns beside itself
// (detail::close_on_exit, detail::stage_exit), which the distributed
// driver's run_windows shares. Run on four threads over one strand too, so
// that TSan sees the spawned coroutines' completions race with nothing.
#include <utility>

#include <atomic>
#include <exception>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <catch2/catch.hpp>

#include <sluice/core/channel.hpp>
#include <sluice/core/run.hpp>
#include <sluice/core/task.hpp>
#include <sluice/stages/pipeline.hpp>

#include "support/coro.hpp"

using namespace sluice;

namespace {

// Adds `add` to each item; throws once it has passed `fail_after` items (0: never).
struct add_stage : pipeable {
  using input_type = int;
  using output_type = int;
  int add = 1;
  int fail_after = 0;
  [[nodiscard]] task<void> run(channel<int>& in, channel<int>& out) {
    int n = 0;
    for (;;) {
      auto v = co_await in.receive();
      if (!v) break;
      if (fail_after && n == fail_after) throw std::runtime_error("stage failed after " + std::to_string(n));
      ++n;
      co_await out.send(*v + add);
    }
  }
};
static_assert(pipeline_stage<add_stage>);

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// run_pipeline(stage, items) to completion on `threads` threads (a strand of
// one io_context when more than one); the outputs, or the error's message.
template <class Stage>
std::pair<std::vector<int>, std::string> run_on(Stage& stage, std::vector<int>& items, unsigned threads) {
  std::vector<int> got;
  asio::io_context ioc;
  try {
    run_blocking(ioc, run_pipeline(stage, items, [&](int v) { got.push_back(v); }), threads);
  } catch (const std::exception& e) {
    return {got, e.what()};
  }
  return {got, ""};
}

task<void> end_or_fail(bool fail) {
  if (fail) throw std::runtime_error("the stage failed");
  co_return;
}

// A stage's runner, as run_pipeline and the distributed driver's run_windows make it.
task<void> spawn_and_join(channel<int>& in, channel<int>& out, std::exception_ptr& failure, bool fail) {
  auto ex = co_await this_executor;
  joined_spawn runner(ex, end_or_fail(fail), detail::stage_exit<int, int>{&in, &out, &failure});
  co_await runner.join();
}

}  // namespace

TEST_CASE("a stage's runner closes its output when the stage ends, and leaves its input alone", "[stages][pipeline]") {
  channel<int> in{1}, out{1};
  std::exception_ptr failure;
  sluice_test::run(spawn_and_join(in, out, failure, false));
  REQUIRE_FALSE(failure);
  REQUIRE_FALSE(in.aborted());
  REQUIRE_FALSE(out.aborted());
  REQUIRE_FALSE(sluice_test::run(out.receive()).has_value());  // closed and drained
}

TEST_CASE("a stage's runner keeps the stage's error and aborts both of its channels", "[stages][pipeline]") {
  channel<int> in{1}, out{1};
  std::exception_ptr failure;
  sluice_test::run(spawn_and_join(in, out, failure, true));
  REQUIRE(failure);
  REQUIRE(in.aborted());
  REQUIRE(out.aborted());
  REQUIRE_THROWS_WITH(sluice_test::run(out.receive()), "the stage failed");
  REQUIRE_THROWS_WITH(sluice_test::run(in.send(1)), "the stage failed");
}

TEST_CASE("run_pipeline delivers every item in order, on one thread and on four over a strand", "[stages][pipeline][concurrent]") {
  for (const unsigned threads : {1u, 4u}) {
    INFO(threads << " threads");
    add_stage s;
    auto items = iota(1000);
    const auto [got, error] = run_on(s, items, threads);
    REQUIRE(error.empty());
    REQUIRE(got.size() == 1000);
    for (int i = 0; i < 1000; ++i) REQUIRE(got[static_cast<std::size_t>(i)] == i + 1);
  }
}

TEST_CASE("a stage that fails stops its feeder and its consumer, and run_pipeline rethrows its error",
          "[stages][pipeline][concurrent]") {
  // More items than the channels hold: a feeder that were not stopped would
  // wait on a full channel for ever, and run_pipeline would not return.
  for (const unsigned threads : {1u, 4u})
    for (const int fail_after : {1, 2, 3, 17, 500}) {
      INFO(threads << " threads, failing after " << fail_after);
      add_stage s;
      s.fail_after = fail_after;
      auto items = iota(1000);
      const auto [got, error] = run_on(s, items, threads);
      REQUIRE(error == "stage failed after " + std::to_string(fail_after));
      REQUIRE(got.size() <= static_cast<std::size_t>(fail_after));
    }
}

TEST_CASE("in a | b, a failing upstream stage aborts the channel between them, and the composition rethrows",
          "[stages][pipeline][concurrent]") {
  for (const unsigned threads : {1u, 4u}) {
    INFO(threads << " threads");
    auto p = add_stage{{}, 1, 5} | add_stage{{}, 10, 0};
    auto items = iota(1000);
    const auto [got, error] = run_on(p, items, threads);
    REQUIRE(error == "stage failed after 5");
    REQUIRE(got.size() <= 5);
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == static_cast<int>(i) + 11);
  }
}

TEST_CASE("pipelines that fail at every point leave nothing running behind them", "[stages][pipeline][concurrent]") {
  // ASan sees a frame or channel used after its runner returned; TSan, a
  // completion racing with the runner's frame.
  for (int fail_after = 1; fail_after <= 40; ++fail_after) {
    auto p = add_stage{{}, 1, 0} | add_stage{{}, 1, fail_after} | add_stage{{}, 1, 0};
    auto items = iota(64);
    const auto [got, error] = run_on(p, items, 4);
    REQUIRE(error == "stage failed after " + std::to_string(fail_after));
  }
}
