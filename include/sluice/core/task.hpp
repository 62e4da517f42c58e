#pragma once
/// \file
/// The one coroutine type (Boost.Asio's `awaitable`). Running one from a
/// plain thread, or beside another: core/run.hpp.

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/awaitable.hpp>
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

}  // namespace sluice::inline v0
