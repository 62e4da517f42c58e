#pragma once
/// \file
/// The one coroutine type (Boost.Asio's `awaitable`) and helpers to run and
/// spawn coroutines without losing their exceptions.

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <exception>
#include <optional>
#include <type_traits>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sluice/config.hpp>

namespace sluice::inline v0 {

namespace asio = boost::asio;

/// A coroutine returning T. Every API returning a task is [[nodiscard]]:
/// a forgotten co_await would silently drop the work.
template <class T = void>
using task = asio::awaitable<T>;

/// `co_await` this to get the executor the current coroutine runs on.
inline constexpr auto this_executor = asio::this_coro::executor;

/// Runs `t` to completion on `ioc` (calling `ioc.run()` on this thread, then
/// restarting it) and returns its result or rethrows its exception.
template <class T>
T run_blocking(asio::io_context& ioc, task<T> t) {
  std::exception_ptr failure;
  std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> result;
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(ioc, std::move(t), [&](std::exception_ptr e) {
      failure = e;
      result.emplace(true);
    });
  } else {
    asio::co_spawn(ioc, std::move(t), [&](std::exception_ptr e, T v) {
      failure = e;
      if (!e) result.emplace(std::move(v));
    });
  }
  ioc.restart();
  ioc.run();
  if (failure) std::rethrow_exception(failure);
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

/// Runs `t` on a private io_context on the calling thread.
template <class T>
T run_blocking(task<T> t) {
  asio::io_context ioc{1};
  return run_blocking(ioc, std::move(t));
}

}  // namespace sluice::inline v0
