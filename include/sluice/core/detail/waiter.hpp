#pragma once
/// \file
/// A queue of type-erased, move-only completion handlers `void()`, woken by
/// posting each to its own associated executor (never resumed inline: a
/// resumption inside a completion nests the waiter's frames on the
/// completer's stack, and a long chain of synchronous completions would
/// overflow it).

#include <utility>

#include <deque>
#include <memory>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sluice/core/task.hpp>

namespace sluice::inline v0::detail {

class waiter_queue {
 public:
  waiter_queue() = default;
  waiter_queue(const waiter_queue&) = delete;
  waiter_queue& operator=(const waiter_queue&) = delete;

  /// Suspends the calling coroutine until woken by wake_one/wake_all.
  [[nodiscard]] task<void> wait() {
    return asio::async_initiate<decltype(asio::use_awaitable), void()>(
        [this](auto handler) { q_.push_back(std::make_unique<impl<decltype(handler)>>(std::move(handler))); },
        asio::use_awaitable);
  }
  /// Queues a completion handler (for callers that run their own initiation).
  template <class H>
  void push(H handler) {
    q_.push_back(std::make_unique<impl<H>>(std::move(handler)));
  }
  /// Wakes the oldest waiter, if any. Returns whether one was woken.
  bool wake_one() noexcept {
    if (q_.empty()) return false;
    auto w = std::move(q_.front());
    q_.pop_front();
    w->post();
    return true;
  }
  void wake_all() noexcept {
    auto all = std::move(q_);
    q_.clear();
    for (auto& w : all) w->post();
  }
  [[nodiscard]] bool empty() const noexcept { return q_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return q_.size(); }

 private:
  struct base {
    virtual ~base() = default;
    virtual void post() noexcept = 0;
  };
  template <class H>
  struct impl final : base {
    explicit impl(H h) : handler(std::move(h)) {}
    void post() noexcept override {
      auto ex = asio::get_associated_executor(handler);
      asio::post(ex, std::move(handler));
    }
    H handler;
  };
  std::deque<std::unique_ptr<base>> q_;
};

}  // namespace sluice::inline v0::detail
