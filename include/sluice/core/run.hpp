#pragma once
/// \file
/// Running coroutines without losing their exceptions or outliving what they
/// reference: `run_blocking` (a task to completion on an io_context, from a
/// plain thread) and `joined_spawn` (a coroutine beside the caller, which
/// joins it before its frame goes).

#include <utility>

#include <exception>
#include <optional>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>

namespace sluice::inline v0 {

namespace detail {
// Whether this thread is running an io_context for run_blocking: a
// run_blocking from there would block that io_context's thread (and every
// coroutine and handler on it) until the nested one ends.
inline thread_local bool inside_run_blocking = false;

struct run_blocking_scope {
  bool was = std::exchange(inside_run_blocking, true);
  run_blocking_scope() = default;
  run_blocking_scope(const run_blocking_scope&) = delete;
  run_blocking_scope& operator=(const run_blocking_scope&) = delete;
  ~run_blocking_scope() { inside_run_blocking = was; }
};
}  // namespace detail

/// Runs `t` to completion on `ioc` with `threads` threads (this one included;
/// with more than one, `t` runs on a strand of `ioc`), then returns its result
/// or rethrows its exception once every handler has run. Restarts `ioc`
/// first, so one io_context can run tasks one after another.
///
/// For plain threads only: called from a coroutine or handler that a
/// run_blocking runs, it throws usage_error before running anything (it
/// would block that thread's io_context; co_await the task instead).
template <class T>
T run_blocking(asio::io_context& ioc, task<T> t, unsigned threads = 1) {
  if (detail::inside_run_blocking)
    throw usage_error("run_blocking called from a coroutine or handler run by run_blocking: it would block that "
                      "io_context's thread (co_await the task instead)");
  std::exception_ptr failure;
  std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> result;
  auto spawn = [&](auto ex) {
    if constexpr (std::is_void_v<T>) {
      asio::co_spawn(ex, std::move(t), [&](std::exception_ptr e) {
        failure = e;
        result.emplace(true);
      });
    } else {
      asio::co_spawn(ex, std::move(t), [&](std::exception_ptr e, T v) {
        failure = e;
        if (!e) result.emplace(std::move(v));
      });
    }
  };
  if (threads > 1)
    spawn(asio::make_strand(ioc));
  else
    spawn(ioc.get_executor());
  ioc.restart();
  std::vector<std::thread> helpers;
  for (unsigned i = 1; i < threads; ++i)
    helpers.emplace_back([&ioc] {
      const detail::run_blocking_scope scope;
      ioc.run();
    });
  {
    const detail::run_blocking_scope scope;
    ioc.run();
  }
  for (auto& th : helpers) th.join();
  if (failure) std::rethrow_exception(failure);
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

/// Runs `t` on a private io_context on the calling thread.
template <class T>
T run_blocking(task<T> t) {
  asio::io_context ioc{1};
  return run_blocking(ioc, std::move(t));
}

/// A coroutine spawned beside the calling one, which must `co_await join()`
/// before anything the coroutine references goes (structured concurrency:
/// it never outlives its parent's frame). `on_exit(exception_ptr)` runs when
/// it ends, on its executor, before join() returns: the place to close or
/// abort the channels it fed. Not movable (the completion refers to it).
class joined_spawn {
 public:
  template <class Executor, class OnExit>
  joined_spawn(const Executor& ex, task<void> t, OnExit on_exit) {
    asio::co_spawn(ex, std::move(t), [this, on_exit = std::move(on_exit)](std::exception_ptr e) mutable {
      on_exit(e);
      done_.close();
    });
  }
  joined_spawn(const joined_spawn&) = delete;
  joined_spawn& operator=(const joined_spawn&) = delete;

  /// Completes once the coroutine has ended and its `on_exit` has run.
  [[nodiscard]] task<void> join() {
    // why: a co_await inside the loop's condition loses `this` in GCC 12's
    // coroutine frame (misaligned member access, then a crash); awaiting in
    // the body does not.
    for (;;) {
      const auto v = co_await done_.receive();
      if (!v) co_return;
    }
  }

 private:
  channel<std::monostate> done_{1};  // closed == ended
};

}  // namespace sluice::inline v0
