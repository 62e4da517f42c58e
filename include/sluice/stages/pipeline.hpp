#pragma once
/// \file
/// Composition of stages with `|`, and running a pipeline over a sequence.
///
/// `a | b` is itself a stage: it runs `a` into a bounded channel that `b`
/// reads, so a slow `b` back-pressures `a`. Both run on the caller's executor
/// (keep a pipeline on one strand: channels are strand-confined). An error in
/// either stops the other promptly (the channel between them is aborted) and
/// the composition returns only after both have finished.

#include <utility>

#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <variant>

#include <sluice/core/channel.hpp>
#include <sluice/core/run.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0 {

namespace detail {
// The completions of the coroutines a runner spawns beside itself (the
// `on_exit` of a joined_spawn): named types holding pointers, constructed in
// place in the joined_spawn's arguments. Not lambdas, so that no capture
// can outlive what it names, and not a helper that returns a joined_spawn,
// whose `this` a GCC 12 coroutine frame would lose through the returned
// prvalue (STYLE.md, pitfalls 1 and 2).

// A producer into `ch` ended: the runner, not the producer, closes its
// channel; an error aborts it, so that the consumer rethrows it.
template <class T>
struct close_on_exit {
  channel<T>* ch;
  void operator()(std::exception_ptr e) const noexcept {
    if (e)
      ch->abort(e);
    else
      ch->close();
  }
};

// A stage between `in` and `out` ended: closes `out`; on error, keeps it in
// `*failure` and aborts both channels, so that what reads `out` stops and so
// does whatever feeds `in`.
template <class In, class Out>
struct stage_exit {
  channel<In>* in;
  channel<Out>* out;
  std::exception_ptr* failure;
  void operator()(std::exception_ptr e) const noexcept {
    if (e) {
      *failure = e;
      out->abort(e);
      in->abort(e);
    } else {
      out->close();
    }
  }
};
}  // namespace detail

template <class A, class B>
class composed : public pipeable {
 public:
  using input_type = typename A::input_type;
  using output_type = typename B::output_type;
  using middle_type = typename A::output_type;

  composed(A a, B b, std::size_t capacity = 2) : a_(std::move(a)), b_(std::move(b)), capacity_(capacity) {}

  [[nodiscard]] A& first() noexcept { return a_; }
  [[nodiscard]] B& second() noexcept { return b_; }

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    auto ex = co_await this_executor;
    channel<middle_type> mid{capacity_};
    joined_spawn upstream(ex, a_.run(in, mid), detail::close_on_exit<middle_type>{&mid});
    std::exception_ptr failure;
    try {
      co_await b_.run(mid, out);
    } catch (...) {
      failure = std::current_exception();
      mid.abort(failure);  // stops upstream promptly
      in.abort(failure);   // and whatever feeds it
    }
    co_await upstream.join();  // structured: never outlive `mid`
    if (failure) std::rethrow_exception(failure);
    // Upstream may have failed after b_ finished (b_ stops early only on error).
  }

 private:
  A a_;
  B b_;
  std::size_t capacity_;
};

template <class A, class B>
  requires std::derived_from<A, pipeable> && std::derived_from<B, pipeable>
[[nodiscard]] auto operator|(A a, B b) {
  static_assert(pipeline_stage<A> && pipeline_stage<B>, "sluice: both operands of | must model sluice::pipeline_stage");
  static_assert(std::same_as<typename A::output_type, typename B::input_type>,
                "sluice: a stage's output_type must equal the next stage's input_type");
  return composed<A, B>{std::move(a), std::move(b)};
}

namespace detail {
template <class T, class Range>
task<void> feed(channel<T>& in, Range& items) {
  for (auto& item : items) co_await in.send(item);
}
}  // namespace detail

namespace detail {
// Aborts a running pipeline's channels when a stop is requested: the abort is
// posted to the pipeline's executor, and `alive` (only touched there) guards
// against a stop that arrives after the pipeline ended.
struct stop_state {
  bool alive = true;
  std::function<void()> abort;
};
template <class Ex>
struct stop_poster {
  Ex ex;
  std::shared_ptr<stop_state> state;
  void operator()() const noexcept {
    asio::post(ex, [s = state] {
      if (s->alive) s->abort();
    });
  }
};
}  // namespace detail

/// Runs `stage` over `items` (sent in order) and calls `consume(output)` for
/// each output, on the calling coroutine's executor. Returns when everything
/// has flowed through; rethrows the first error (after every part stopped).
/// A stop requested through `stop` aborts the pipeline with cancelled_error;
/// the stages unwind (in-flight reads complete first) and it returns promptly.
template <pipeline_stage Stage, class Range, class Consume>
[[nodiscard]] task<void> run_pipeline(Stage& stage, Range& items, Consume consume, std::stop_token stop = {},
                                      std::size_t capacity = 2) {
  using In = typename Stage::input_type;
  using Out = typename Stage::output_type;
  auto ex = co_await this_executor;
  if (stop.stop_requested()) throw cancelled_error();
  channel<In> in{capacity};
  channel<Out> out{capacity};
  auto stop_state = std::make_shared<detail::stop_state>();
  stop_state->abort = [&in, &out] {
    auto e = std::make_exception_ptr(cancelled_error());
    in.abort(e);
    out.abort(e);
  };
  std::optional<std::stop_callback<detail::stop_poster<decltype(ex)>>> on_stop;
  if (stop.stop_possible()) on_stop.emplace(stop, detail::stop_poster<decltype(ex)>{ex, stop_state});
  joined_spawn feeder(ex, detail::feed(in, items), detail::close_on_exit<In>{&in});
  std::exception_ptr stage_failure;
  joined_spawn runner(ex, stage.run(in, out), detail::stage_exit<In, Out>{&in, &out, &stage_failure});
  std::exception_ptr failure;
  try {
    while (auto v = co_await out.receive()) consume(std::move(*v));
  } catch (...) {
    failure = std::current_exception();
    out.abort(failure);
    in.abort(failure);
  }
  co_await runner.join();
  co_await feeder.join();
  stop_state->alive = false;
  if (stage_failure) std::rethrow_exception(stage_failure);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace sluice::inline v0
