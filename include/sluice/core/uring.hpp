#pragma once
/// \file
/// io_uring inside an Asio io_context: submissions are Asio async operations
/// (co_await-able), completions are signalled through an eventfd registered
/// with the ring and awaited by an Asio descriptor.
///
/// One ring per context, touched only on the context's strand. The eventfd is a
/// hint: every wake-up drains the CQ until empty. In-flight operations are
/// capped at the CQ size; the rest wait in a pending queue. An operation
/// completes exactly once, also when cancelled; no buffer passed to a read may
/// be released before its completion handler has run.

#include <utility>

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <unordered_set>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/error_code.hpp>
#include <fmt/format.h>

#include <sluice/core/task.hpp>
#include <sluice/error.hpp>

namespace sluice::inline v0 {

struct uring_options {
  unsigned entries = 64;            ///< SQ size (CQ is twice that); caps in-flight ops
  bool register_buffers = true;     ///< allow register_buffers() (falls back if refused)
};

class uring_context {
 public:
  /// Throws io_error if io_uring is unavailable (e.g. blocked by seccomp).
  explicit uring_context(asio::io_context& ioc, uring_options opt = {})
      : strand_(asio::make_strand(ioc)), eventfd_(ioc) {
    io_uring_params p{};
    if (const int r = ::io_uring_queue_init_params(opt.entries, &ring_, &p); r < 0)
      throw io_error(fmt::format("io_uring_queue_init: {}", std::strerror(-r)), {}, -r);
    cq_entries_ = p.cq_entries;
    const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd < 0 || ::io_uring_register_eventfd(&ring_, efd) < 0) {
      const int e = errno;
      if (efd >= 0) ::close(efd);
      ::io_uring_queue_exit(&ring_);
      throw io_error(fmt::format("io_uring_register_eventfd: {}", std::strerror(e)), {}, e);
    }
    eventfd_.assign(efd);
  }
  uring_context(const uring_context&) = delete;
  uring_context& operator=(const uring_context&) = delete;

  /// Cancels what is in flight, waits for every completion (no buffer is
  /// released while the kernel may still write it), then closes the ring.
  /// Handlers of operations still pending are destroyed without being called;
  /// call only once the io_context no longer runs handlers of this context.
  ~uring_context() {
    boost::system::error_code ignored;
    eventfd_.cancel(ignored);
    if (!inflight_.empty()) {
      // One request cancels them all; if the SQ is full, what is queued goes
      // first so that a slot frees.
      io_uring_sqe* s = ::io_uring_get_sqe(&ring_);
      if (!s) {
        (void)::io_uring_submit(&ring_);
        s = ::io_uring_get_sqe(&ring_);
      }
      if (s) {
        ::io_uring_prep_cancel64(s, 0, IORING_ASYNC_CANCEL_ANY);
        ::io_uring_sqe_set_data64(s, 0);
      }
      // Every read in flight completes (cancelled or not) before its buffer
      // may be released: a signal (EINTR: a Ctrl-C in Python) or a full CQ
      // (EBUSY/EAGAIN) interrupts the wait, never ends it.
      while (!inflight_.empty()) {
        io_uring_cqe* cqe = nullptr;
        const int r = ::io_uring_submit_and_wait(&ring_, 1);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) break;   // the ring itself is gone
        while (::io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe) {
          auto* op = static_cast<op_base*>(::io_uring_cqe_get_data(cqe));
          ::io_uring_cqe_seen(&ring_, cqe);
          if (op && inflight_.erase(op)) op->destroy();
        }
      }
    }
    for (auto* op : pending_) op->destroy();
    ::io_uring_queue_exit(&ring_);
  }

  /// Registers `region` as fixed buffer 0..n-1, cut in `piece`-byte buffers
  /// (reads into it then use READ_FIXED). Returns false — and the context keeps
  /// using plain reads — if the kernel refuses (e.g. the memlock limit for a
  /// non-root user). Call before any read.
  bool register_buffers(std::span<std::byte> region, std::size_t piece) {
    if (region.empty() || piece == 0) return false;
    std::vector<iovec> iov;
    for (std::size_t off = 0; off < region.size(); off += piece)
      iov.push_back({region.data() + off, std::min(piece, region.size() - off)});
    if (::io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size())) < 0) return false;
    fixed_base_ = region.data();
    fixed_size_ = region.size();
    fixed_piece_ = piece;
    return true;
  }
  [[nodiscard]] bool buffers_registered() const noexcept { return fixed_base_ != nullptr; }

  /// Reads up to buf.size() bytes at `offset` from `fd`. Completes with
  /// (error_code, bytes): short reads are normal (0 = end of file); errors are
  /// errno values in the system category; a cancelled read completes with
  /// operation_aborted. The buffer must stay valid until completion.
  /// `punt`: submit with IOSQE_ASYNC, so the kernel's io-wq workers do the
  /// read instead of the submitting thread trying it inline first; for reads
  /// served from the page cache this spreads the copying over several cores.
  template <class Token>
  auto async_read_at(int fd, std::span<std::byte> buf, std::uint64_t offset, Token&& token) {
    return async_read_at(fd, buf, offset, false, std::forward<Token>(token));
  }
  template <class Token>
  auto async_read_at(int fd, std::span<std::byte> buf, std::uint64_t offset, bool punt, Token&& token) {
    return asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this, fd, buf, offset, punt](auto handler) {
          using H = decltype(handler);
          auto* op = new read_op<H>(std::move(handler), fd, buf, offset, punt);
          asio::dispatch(strand_, [this, op] { submit(op); });
        },
        token);
  }

  /// `madvise(addr, len, advice)` on an io-wq worker (io_uring always runs it
  /// asynchronously): e.g. MADV_POPULATE_READ maps pages of a file mapping
  /// into the page tables off the calling thread. Completes with
  /// (error_code, 0); errno values in the system category (EFAULT: a page
  /// past the file's end), operation_aborted when cancelled. Precondition:
  /// `len` < 4 GiB (the SQE's length is 32 bits; callers cut larger ranges).
  template <class Token>
  auto async_madvise(void* addr, std::size_t len, int advice, Token&& token) {
    return asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this, addr, len, advice](auto handler) {
          using H = decltype(handler);
          auto* op = new madvise_op<H>(std::move(handler), addr, len, advice);
          asio::dispatch(strand_, [this, op] { submit(op); });
        },
        token);
  }

  /// Awaitable form: returns bytes read (short reads possible); throws
  /// boost::system::system_error on failure.
  [[nodiscard]] task<std::size_t> read_at(int fd, std::span<std::byte> buf, std::uint64_t offset) {
    return async_read_at(fd, buf, offset, asio::use_awaitable);
  }

  /// Requests cancellation of every operation in flight or pending. Each still
  /// completes exactly once (operation_aborted, or its result if it finished first).
  void cancel_all() {
    asio::dispatch(strand_, [this] {
      auto pending = std::move(pending_);
      pending_.clear();
      for (auto* op : pending) op->complete(-ECANCELED);
      if (inflight_.empty()) return;
      if (io_uring_sqe* s = ::io_uring_get_sqe(&ring_)) {
        ::io_uring_prep_cancel64(s, 0, IORING_ASYNC_CANCEL_ANY);
        ::io_uring_sqe_set_data64(s, 0);  // user_data 0: internal op, ignored on reaping
        ::io_uring_submit(&ring_);
      }
    });
  }

  [[nodiscard]] unsigned in_flight_limit() const noexcept { return cq_entries_; }

 private:
  struct op_base {
    virtual ~op_base() = default;
    virtual void prep(io_uring_sqe* s, const uring_context& ctx) = 0;
    virtual void complete(int res) noexcept = 0;   // posts the handler, then deletes this
    virtual void destroy() noexcept { delete this; }
  };
  // An operation whose handler takes (error_code, bytes): its completion.
  template <class H>
  struct handler_op : op_base {
    explicit handler_op(H h) : handler(std::move(h)), work(asio::make_work_guard(asio::get_associated_executor(handler))) {}
    void complete(int res) noexcept override {
      boost::system::error_code ec;
      std::size_t n = 0;
      if (res == -ECANCELED)
        ec = asio::error::operation_aborted;
      else if (res < 0)
        ec.assign(-res, boost::system::system_category());
      else
        n = static_cast<std::size_t>(res);
      auto ex = asio::get_associated_executor(handler);
      // Post, never run inline: the reaper is on the ring's strand, and user
      // code run here would nest inside the drain of the CQ.
      asio::post(ex, [h = std::move(handler), ec, n]() mutable { std::move(h)(ec, n); });
      delete this;
    }
    H handler;
    asio::executor_work_guard<asio::associated_executor_t<H>> work;  // keeps run() alive while the op is in the ring
  };
  template <class H>
  struct read_op final : handler_op<H> {
    read_op(H h, int f, std::span<std::byte> b, std::uint64_t o, bool p)
        : handler_op<H>(std::move(h)), fd(f), buf(b), off(o), punt(p) {}
    void prep(io_uring_sqe* s, const uring_context& ctx) override {
      const unsigned len = static_cast<unsigned>(std::min<std::size_t>(buf.size(), 1u << 30));
      const int idx = ctx.fixed_index(buf);
      if (idx >= 0)
        ::io_uring_prep_read_fixed(s, fd, buf.data(), len, off, idx);
      else
        ::io_uring_prep_read(s, fd, buf.data(), len, off);
      if (punt) ::io_uring_sqe_set_flags(s, IOSQE_ASYNC);
    }
    int fd;
    std::span<std::byte> buf;
    std::uint64_t off;
    bool punt;
  };
  template <class H>
  struct madvise_op final : handler_op<H> {
    madvise_op(H h, void* a, std::size_t l, int adv) : handler_op<H>(std::move(h)), addr(a), len(l), advice(adv) {}
    void prep(io_uring_sqe* s, const uring_context&) override {
      ::io_uring_prep_madvise(s, addr, static_cast<off_t>(len), advice);
    }
    void* addr;
    std::size_t len;
    int advice;
  };

  int fixed_index(std::span<std::byte> buf) const noexcept {
    if (!fixed_base_ || buf.data() < fixed_base_ || buf.data() + buf.size() > fixed_base_ + fixed_size_) return -1;
    const auto first = static_cast<std::size_t>(buf.data() - fixed_base_) / fixed_piece_;
    const auto last = static_cast<std::size_t>(buf.data() + buf.size() - 1 - fixed_base_) / fixed_piece_;
    return first == last ? static_cast<int>(first) : -1;
  }

  // On strand_.
  void submit(op_base* op) {
    if (inflight_.size() >= cq_entries_) {
      pending_.push_back(op);
      return;
    }
    io_uring_sqe* s = ::io_uring_get_sqe(&ring_);
    if (!s) {
      ::io_uring_submit(&ring_);
      s = ::io_uring_get_sqe(&ring_);
    }
    if (!s) {
      pending_.push_back(op);
      return;
    }
    op->prep(s, *this);
    ::io_uring_sqe_set_data(s, op);
    inflight_.insert(op);
    // The eventfd wait is armed only while operations are in flight, so an
    // idle ring holds no work and io_context::run() can return.
    if (!armed_) arm();
    if (const int r = ::io_uring_submit(&ring_); r < 0) {
      inflight_.erase(op);
      op->complete(r);
    }
  }

  void arm() {
    armed_ = true;
    eventfd_.async_wait(asio::posix::stream_descriptor::wait_read,
                        asio::bind_executor(strand_, [this](boost::system::error_code ec) {
                          armed_ = false;
                          if (ec) return;  // operation_aborted at shutdown
                          std::uint64_t hint;
                          (void)!::read(eventfd_.native_handle(), &hint, sizeof hint);  // a hint only
                          reap();
                          if (!inflight_.empty() && !armed_) arm();
                        }));
  }

  void reap() {
    io_uring_cqe* cqes[64];
    while (unsigned n = ::io_uring_peek_batch_cqe(&ring_, cqes, 64)) {
      std::pair<op_base*, int> done[64];
      for (unsigned i = 0; i < n; ++i) done[i] = {static_cast<op_base*>(::io_uring_cqe_get_data(cqes[i])), cqes[i]->res};
      ::io_uring_cq_advance(&ring_, n);  // free CQ slots before user code runs
      for (unsigned i = 0; i < n; ++i) {
        if (!done[i].first) continue;  // internal (cancel) op
        inflight_.erase(done[i].first);
        done[i].first->complete(done[i].second);
      }
      while (!pending_.empty() && inflight_.size() < cq_entries_) {
        auto* op = pending_.front();
        pending_.pop_front();
        submit(op);
      }
    }
  }

  asio::strand<asio::io_context::executor_type> strand_;
  asio::posix::stream_descriptor eventfd_;
  io_uring ring_{};
  unsigned cq_entries_ = 0;
  bool armed_ = false;
  std::unordered_set<op_base*> inflight_;
  std::deque<op_base*> pending_;
  std::byte* fixed_base_ = nullptr;
  std::size_t fixed_size_ = 0, fixed_piece_ = 0;
};

}  // namespace sluice::inline v0
