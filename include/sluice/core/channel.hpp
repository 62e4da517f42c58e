#pragma once
/// \file
/// A bounded FIFO between coroutines: `send` suspends while the channel is
/// full (backpressure), `receive` while it is empty.
///
/// Strand-confined: every call must come from coroutines running on one strand
/// (or a single-threaded io_context). No locks; wake-ups are posted to the
/// waiter's own executor.

#include <utility>

#include <cstddef>
#include <deque>
#include <exception>
#include <optional>

#include <sluice/core/detail/waiter.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>

namespace sluice::inline v0 {

template <class T>
class channel {
 public:
  using value_type = T;

  /// `capacity` >= 1 items may be buffered before `send` suspends.
  explicit channel(std::size_t capacity = 1) : capacity_(capacity ? capacity : 1) {}
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  /// Enqueues `v`, suspending while the channel is full. Throws the abort
  /// reason if the channel was aborted, and error if it was closed.
  [[nodiscard]] task<void> send(T v) {
    while (q_.size() >= capacity_ && !closed_ && !failure_) co_await senders_.wait();
    if (failure_) std::rethrow_exception(failure_);
    if (closed_) throw usage_error("send on a closed channel");
    q_.push_back(std::move(v));
    receivers_.wake_one();
  }

  /// Dequeues the next item, suspending while the channel is empty.
  /// Returns nullopt once the channel is closed and drained. Throws the abort
  /// reason if the channel was aborted (buffered items are dropped).
  [[nodiscard]] task<std::optional<T>> receive() {
    while (q_.empty() && !closed_ && !failure_) co_await receivers_.wait();
    if (failure_) std::rethrow_exception(failure_);
    if (q_.empty()) co_return std::nullopt;
    std::optional<T> v{std::move(q_.front())};
    q_.pop_front();
    senders_.wake_one();
    co_return v;
  }

  /// End of stream: receivers drain what is buffered, then get nullopt.
  void close() noexcept {
    closed_ = true;
    receivers_.wake_all();
    senders_.wake_all();
  }

  /// Error: buffered items are dropped, waiters and later calls throw `e`.
  /// The first abort wins.
  void abort(std::exception_ptr e) noexcept {
    if (!failure_) failure_ = e;
    q_.clear();
    receivers_.wake_all();
    senders_.wake_all();
  }

  [[nodiscard]] std::size_t size() const noexcept { return q_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] bool closed() const noexcept { return closed_; }
  [[nodiscard]] bool aborted() const noexcept { return failure_ != nullptr; }

 private:
  std::size_t capacity_;
  std::deque<T> q_;
  bool closed_ = false;
  std::exception_ptr failure_;
  detail::waiter_queue senders_, receivers_;
};

}  // namespace sluice::inline v0
