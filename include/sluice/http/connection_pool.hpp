#pragma once
/// \file
/// A bounded pool of keep-alive connections: at most `capacity` are checked out
/// at once (that bounds the requests in flight), idle ones are reused. A
/// coroutine that finds the pool exhausted suspends until a lease is returned.
/// Knows nothing about HTTP: `Conn` is any connection type.

#include <utility>   // before Asio (Boost 1.74)

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <sluice/core/task.hpp>

namespace sluice::inline v0::http {

/// A pool of at most `capacity` connections in use. Thread-safe; waiters are
/// resumed through their own executor (never inline from `release`).
/// The pool must outlive its leases and waiters.
template <class Conn>
class connection_pool {
 public:
  using pointer = std::unique_ptr<Conn>;

  /// A checked-out slot. `conn` is an idle connection to reuse, or null (the
  /// holder connects and stores it). The slot returns to the pool when the
  /// lease is destroyed; the connection is kept for reuse only after
  /// `keep()` (a connection in an unknown state must not be reused).
  class lease {
   public:
    lease() = default;
    lease(lease&& o) noexcept
        : conn(std::move(o.conn)), pool_(std::exchange(o.pool_, nullptr)), keep_(o.keep_), reused_(o.reused_) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        reset();
        pool_ = std::exchange(o.pool_, nullptr);
        conn = std::move(o.conn);
        keep_ = o.keep_;
        reused_ = o.reused_;
      }
      return *this;
    }
    ~lease() { reset(); }
    /// Marks the connection reusable (call after a complete response).
    void keep() noexcept { keep_ = true; }
    /// Marks it not reusable (after a failure); the default.
    void discard() noexcept { keep_ = false; }
    [[nodiscard]] bool reused() const noexcept { return reused_; }

    pointer conn;   ///< the connection (null until connected)

   private:
    friend class connection_pool;
    lease(connection_pool* p, pointer c) : conn(std::move(c)), pool_(p), reused_(conn != nullptr) {}
    void reset() {
      if (auto* p = std::exchange(pool_, nullptr)) p->release(keep_ ? std::move(conn) : pointer{});
      conn.reset();
      keep_ = false;
    }
    connection_pool* pool_ = nullptr;
    bool keep_ = false;
    bool reused_ = false;
  };

  /// `capacity` >= 1 connections in use at once; at most `capacity` idle kept.
  explicit connection_pool(std::size_t capacity) : capacity_(capacity ? capacity : 1) {}
  connection_pool(const connection_pool&) = delete;
  connection_pool& operator=(const connection_pool&) = delete;

  /// Suspends until a slot is free; returns its lease. Not cancellable (Boost
  /// 1.74 has no cancellation slots): a waiter is resumed by the next release.
  [[nodiscard]] task<lease> acquire() { return async_acquire(asio::use_awaitable); }

  /// The same as an Asio async operation with signature void(lease).
  template <class Token>
  auto async_acquire(Token&& token) {
    return asio::async_initiate<Token, void(lease)>(
        [this](auto handler) {
          std::unique_lock lock(mutex_);
          if (in_use_ < capacity_) {
            ++in_use_;
            pointer c = take_idle();
            lock.unlock();
            auto ex = asio::get_associated_executor(handler);
            asio::post(ex, [h = std::move(handler), l = lease(this, std::move(c))]() mutable {
              std::move(h)(std::move(l));
            });
            return;
          }
          waiters_.push_back(std::make_unique<waiter<decltype(handler)>>(std::move(handler)));
        },
        token);
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t in_use() const {
    std::lock_guard lock(mutex_);
    return in_use_;
  }
  [[nodiscard]] std::size_t idle() const {
    std::lock_guard lock(mutex_);
    return idle_.size();
  }
  /// Closes (destroys) every idle connection.
  void clear_idle() {
    std::deque<pointer> gone;
    std::lock_guard lock(mutex_);
    gone.swap(idle_);
  }

 private:
  struct waiter_base {
    virtual ~waiter_base() = default;
    virtual void grant(lease l) = 0;
  };
  template <class Handler>
  struct waiter final : waiter_base {
    explicit waiter(Handler h) : handler(std::move(h)), work(asio::get_associated_executor(handler)) {}
    void grant(lease l) override {
      auto ex = asio::get_associated_executor(handler);
      asio::post(ex, [h = std::move(handler), l = std::move(l)]() mutable { std::move(h)(std::move(l)); });
      work.reset();
    }
    Handler handler;
    asio::executor_work_guard<asio::associated_executor_t<Handler>> work;
  };

  pointer take_idle() {
    if (idle_.empty()) return {};
    pointer c = std::move(idle_.back());   // most recently used: least likely to be closed by the server
    idle_.pop_back();
    return c;
  }

  void release(pointer c) {
    std::unique_ptr<waiter_base> next;
    pointer surplus;
    {
      std::lock_guard lock(mutex_);
      if (c) {
        idle_.push_back(std::move(c));
        if (idle_.size() > capacity_) {
          surplus = std::move(idle_.front());
          idle_.pop_front();
        }
      }
      if (!waiters_.empty()) {
        next = std::move(waiters_.front());
        waiters_.pop_front();
        c = take_idle();   // the slot passes straight to the waiter: in_use_ unchanged
      } else {
        --in_use_;
      }
    }
    if (next) next->grant(lease(this, std::move(c)));
  }

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::size_t in_use_ = 0;
  std::deque<pointer> idle_;
  std::deque<std::unique_ptr<waiter_base>> waiters_;
};

}  // namespace sluice::inline v0::http
