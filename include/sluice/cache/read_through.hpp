#pragma once
/// \file
/// Reading a remote object through the node-local cache (block_cache.hpp):
/// every block a read spans is served from its verified file, or fetched
/// whole from the remote once (by whichever reader of the node holds the
/// block's lock), hashed and written as it passes, then served. A block that
/// fails verification is discarded, fetched again and counted.
///
/// Block files are read through the io_uring (O_DIRECT when the block is
/// cold, its buffer aligned and its length a multiple of 4096); hashing and
/// writing run on the cache's worker threads, off the thread that drives the
/// reads. A read that covers a whole block goes straight into the caller's
/// memory; a part of a block goes through a block-sized buffer (the load's
/// `coalesce` keeps requests inside blocks: read_alignment()).

#include <utility>   // before Asio (Boost 1.74)

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <sluice/cache/block_cache.hpp>
#include <sluice/core/detail/waiter.hpp>
#include <sluice/core/task.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/error.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/memory/recycler.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0::cache {

/// Reads of one source through one cache, on one io_context (its io_uring).
class reader {
 public:
  reader(std::shared_ptr<block_cache> cache, asio::io_context& ioc) : cache_(std::move(cache)), ring_(ioc, {32}) {
    // The blocks held for parts come from the memory room's recycler: a
    // load's blocks reuse pages already faulted in (fresh 16 MiB buffers
    // cost a page fault and a zeroed page per 4 KiB).
    buffers_.reserve(static_cast<std::size_t>((max_held + 2) * cache_->opts().block_size));
  }

  [[nodiscard]] block_cache& cache() noexcept { return *cache_; }
  [[nodiscard]] const block_cache& cache() const noexcept { return *cache_; }
  [[nodiscard]] std::shared_ptr<block_cache> shared() const noexcept { return cache_; }

  /// Reads [offset, offset + dst.size()) of `e`'s object (clamped to its
  /// size) into `dst` through the cache; `fetch(offset, span)` reads a whole
  /// block from the remote and returns the bytes it got. `cancelled()` ends
  /// a wait for another writer's block. Returns the bytes read; adds what
  /// the cache did to `counted` (and to the cache's own counters).
  template <class Fetch, class Cancelled>
  [[nodiscard]] task<std::size_t> read(entry& e, std::uint64_t offset, std::span<std::byte> dst, Fetch fetch,
                                       Cancelled cancelled, io_counters& counted) {
    const auto size = e.id().size;
    if (offset >= size || dst.empty()) co_return 0;
    dst = dst.first(static_cast<std::size_t>(std::min<std::uint64_t>(dst.size(), size - offset)));
    const auto bs = e.block_size();
    std::size_t done = 0;
    for (std::uint64_t b = offset / bs; done < dst.size(); ++b) {
      const auto start = b * bs, len = e.block_length(b);
      const auto from = offset + done - start;
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(len - from, dst.size() - done));
      auto out = dst.subspan(done, n);
      if (from == 0 && n == len) co_await serve(e, b, out, fetch, cancelled, counted);
      else co_await serve_part(e, b, from, out, fetch, cancelled, counted);
      done += n;
    }
    co_return done;
  }

 private:
  enum class outcome { hit, missing, bad };

  // A block read for parts of it: requests for other parts of the same block
  // (several tensors in one block) wait for it and copy from it, so that a
  // block is read, verified or fetched once however many requests share it.
  struct held_block {
    lease bytes;
    std::uint64_t length = 0, served = 0;
    bool ready = false;
    std::exception_ptr failed;
    detail::waiter_queue waiters;
  };
  using held_key = std::pair<const entry*, std::uint64_t>;
  /// Ready blocks kept for parts still to come (least recent dropped first).
  static constexpr std::size_t max_held = 8;

  template <class Fetch, class Cancelled>
  task<void> serve_part(entry& e, std::uint64_t b, std::uint64_t from, std::span<std::byte> out, Fetch& fetch,
                        Cancelled& cancelled, io_counters& counted) {
    const held_key key{&e, b};
    std::shared_ptr<held_block> h;
    bool mine = false;
    {
      std::lock_guard lock(held_mutex_);
      auto& slot = held_[key];
      if (!slot) {
        slot = std::make_shared<held_block>();
        slot->length = e.block_length(b);
        slot->bytes = buffers_.get(static_cast<std::size_t>(slot->length));
        mine = true;
      }
      h = slot;
    }
    if (mine) {
      std::exception_ptr failed;
      try {
        co_await serve(e, b, h->bytes.bytes(), fetch, cancelled, counted);
      } catch (...) {
        failed = std::current_exception();
      }
      std::lock_guard lock(held_mutex_);
      h->ready = true;
      h->failed = failed;
      if (failed) {
        held_.erase(key);
      } else {
        ready_order_.push_back(key);
        while (ready_order_.size() > max_held) {
          held_.erase(ready_order_.front());
          ready_order_.pop_front();
        }
      }
      h->waiters.wake_all();
    } else {
      held_block* block = h.get();
      auto until_ready = [this, block](auto handler) {
        std::unique_lock lock(held_mutex_);
        if (!block->ready) {
          block->waiters.push(std::move(handler));
          return;
        }
        lock.unlock();
        auto ex = asio::get_associated_executor(handler);
        asio::post(ex, std::move(handler));
      };
      co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(until_ready, asio::use_awaitable);
    }
    if (h->failed) std::rethrow_exception(h->failed);
    std::memcpy(out.data(), h->bytes.bytes().data() + from, out.size());
    std::lock_guard lock(held_mutex_);
    if ((h->served += out.size()) >= h->length) {   // every part served: let it go
      if (auto it = held_.find(key); it != held_.end() && it->second == h) held_.erase(it);
      std::erase(ready_order_, key);
    }
  }

  // Block `b` into `buf` (its whole length): from its file when it verifies,
  // else fetched under the block's exclusive lock (waiting while another
  // reader of the node holds it).
  template <class Fetch, class Cancelled>
  task<void> serve(entry& e, std::uint64_t b, std::span<std::byte> buf, Fetch& fetch, Cancelled& cancelled,
                   io_counters& counted) {
    auto& c = cache_->stats();
    std::chrono::milliseconds backoff{1};
    for (;;) {
      if (auto shared = e.try_lock(b, false)) {
        std::string why;
        if (co_await from_file(e, b, buf, why) == outcome::hit) {
          c.hit_bytes += buf.size();
          counted.cache_hit_bytes += buf.size();
          co_return;
        }
      }
      if (auto mine = e.try_lock(b, true)) {
        std::string why;
        const auto seen = co_await from_file(e, b, buf, why);
        if (seen == outcome::hit) {   // another writer finished it in between
          c.hit_bytes += buf.size();
          counted.cache_hit_bytes += buf.size();
          co_return;
        }
        if (seen == outcome::bad) {
          ++c.bad_blocks;
          cache_->report(fmt::format("block {} of s3://{}/{} ({}) failed verification and is fetched again: {}", b,
                                     e.id().bucket, e.id().key, e.block_path(b), why));
        }
        e.discard(b);   // a bad file, or a temporary one a dead writer left
        const auto start = b * e.block_size();
        const std::size_t got = co_await fetch(start, buf);
        if (got != buf.size())
          throw truncated_error(fmt::format("the object ended after {} of block {}'s {} bytes", got, b, buf.size()),
                                {fmt::format("s3://{}/{}", e.id().bucket, e.id().key), "",
                                 byte_range{start, start + buf.size()}});
        c.fetched_bytes += got;
        counted.cache_fetched_bytes += got;
        if (seen == outcome::bad) {
          c.refetched_bytes += got;
          counted.cache_refetched_bytes += got;
        }
        auto write = [&] { (void)e.publish(b, buf, e.hash(buf)); };
        co_await on_workers(write);
        co_return;
      }
      // Another reader of the node is writing it (or evicting it): wait.
      if (cancelled()) throw cancelled_error("read cancelled");
      asio::steady_timer t(co_await asio::this_coro::executor, backoff);
      boost::system::error_code ec;
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
    }
  }

  // Block `b` from its file into `buf`, verified.
  task<outcome> from_file(entry& e, std::uint64_t b, std::span<std::byte> buf, std::string& why) {
    const bool aligned = buf.size() % 4096 == 0 && reinterpret_cast<std::uintptr_t>(buf.data()) % 4096 == 0;
    auto f = e.open_block(b, aligned, why);
    if (!f) co_return why.empty() ? outcome::missing : outcome::bad;
    const int fd = f->direct_fd >= 0 ? f->direct_fd : f->fd;
    std::array<std::byte, block_trailer::size> trailer{};
    // A buffered read of a hot block goes to the kernel's io-wq workers
    // (IOSQE_ASYNC): reads in flight copy on several cores, as the file
    // source's do; the trailer's 64 bytes are read inline.
    if (co_await read_exactly(fd, buf, 0, e, b, fd == f->fd) != buf.size() ||
        co_await read_exactly(f->fd, trailer, buf.size(), e, b, false) != trailer.size()) {
      why = "it ended early";
      co_return outcome::bad;
    }
    auto check = [&] { return e.verify(b, buf, trailer, why); };
    const bool ok = co_await on_workers(check);
    if (!ok) co_return outcome::bad;
    e.touch(*f);
    co_return outcome::hit;
  }

  task<std::size_t> read_exactly(int fd, std::span<std::byte> buf, std::uint64_t at, entry& e, std::uint64_t b,
                                 bool punt) {
    std::size_t done = 0;
    while (done < buf.size()) {
      boost::system::error_code ec;
      const auto n = co_await ring_.async_read_at(fd, buf.subspan(done), at + done, punt,
                                                  asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted) throw cancelled_error("read cancelled");
      if (ec)
        throw io_error(fmt::format("reading the cache block failed: {}", ec.message()), {e.block_path(b)}, ec.value());
      if (n == 0) break;
      done += n;
    }
    co_return done;
  }

  // Runs `f` on the cache's worker threads; the coroutine resumes on its own
  // executor afterwards. (Callables are named, not temporaries of a
  // co_await: g++ 12 destroys those twice.)
  template <class F>
  task<std::invoke_result_t<F&>> on_workers(F& f) {
    using R = std::invoke_result_t<F&>;
    auto run = [&f]() -> task<R> { co_return f(); };
    co_return co_await asio::co_spawn(cache_->workers(), run, asio::use_awaitable);
  }

  std::shared_ptr<block_cache> cache_;
  uring_context ring_;
  memory::recycler<memory::anonymous_memory> buffers_;
  std::mutex held_mutex_;
  std::map<held_key, std::shared_ptr<held_block>> held_;
  std::deque<held_key> ready_order_;
};

}  // namespace sluice::inline v0::cache
