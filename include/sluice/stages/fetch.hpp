#pragma once
/// \file
/// fetch: read requests → bytes in a staging slot (or in the request's direct
/// destination). Up to `queue_depth` reads are in flight; results leave in
/// request order. Waiting for a free slot is the backpressure that bounds
/// memory. Short reads are resumed; end of file before the request's end is a
/// truncated_error naming the file, the tensor and the byte range. A mapped
/// request (read_request::mapped) takes no slot: the source hands its bytes
/// out as a view of the page cache (`map`), and the view's lease holds them.

#include <utility>

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <span>
#include <variant>

#include <boost/asio/co_spawn.hpp>
#include <fmt/format.h>

#include <sluice/core/channel.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/stages/admission.hpp>
#include <sluice/stages/coalesce.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0 {

/// A request whose bytes have arrived.
struct fetched {
  read_request request;
  lease hold;                      ///< the slot (empty for a direct read)
  std::span<std::byte> data;       ///< the request's bytes, request.length long
};

struct fetch_options {
  unsigned queue_depth = 4;        ///< reads in flight at most
  /// Asked before each request is issued (stages/admission.hpp); none: every
  /// request goes at once, bounded by the pool and queue_depth alone.
  admission* admit = nullptr;
};

/// Busy-time and volume counters of a stage (read by the loader's summary).
struct step_counters {
  std::uint64_t items = 0;
  std::uint64_t bytes = 0;
  double busy_seconds = 0;         ///< time spent working (fetch: reads in flight)
};

template <source Source>
class fetch : public pipeable {
 public:
  using input_type = read_request;
  using output_type = fetched;

  fetch(Source& src, staging_pool& pool, fetch_options opt = {}) : src_(&src), pool_(&pool), opt_(opt) {
    if (opt_.queue_depth == 0) opt_.queue_depth = 1;
  }

  [[nodiscard]] const step_counters& counters() const noexcept { return *counters_; }

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    auto ex = co_await this_executor;
    std::deque<std::shared_ptr<op>> q;
    std::exception_ptr failure;
    try {
      while (auto req = co_await in.receive()) {
        // The gate first (it may give the request a direct destination, and
        // then it needs no slot). It may wait for the consumer: hand
        // downstream every finished read before, or the wait could be for
        // bytes held here.
        if (opt_.admit && !opt_.admit->try_admit(*req)) {
          while (!q.empty()) co_await deliver(q, out);
          co_await opt_.admit->admit(*req);
        }
        // Never wait for a slot while finished reads sit here unsent: they
        // hold slots only downstream can release.
        const bool needs_slot = req->direct.empty() && !req->mapped;
        while (!q.empty() && (q.size() >= opt_.queue_depth || (needs_slot && pool_->free_count() == 0)))
          co_await deliver(q, out);
        auto o = std::make_shared<op>();
        o->result.request = std::move(*req);
        if (needs_slot) o->result.hold = co_await pool_->acquire();
        if (in_flight_ == 0) busy_since_ = clock::now();
        ++in_flight_;
        asio::co_spawn(ex, read_one(src_, o), [o](std::exception_ptr e) {
          o->failure = e;
          o->done.close();
        });
        q.push_back(std::move(o));
      }
      while (!q.empty()) co_await deliver(q, out);
    } catch (...) {
      failure = std::current_exception();
    }
    // Structured: no slot or buffer is released before its read completed.
    for (auto& o : q)
      while (co_await o->done.receive()) {
      }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  using clock = std::chrono::steady_clock;
  struct op {
    fetched result;
    std::exception_ptr failure;
    channel<std::monostate> done{1};
  };

  task<void> deliver(std::deque<std::shared_ptr<op>>& q, channel<output_type>& out) {
    auto o = q.front();
    while (co_await o->done.receive()) {
    }
    q.pop_front();
    if (--in_flight_ == 0) counters_->busy_seconds += std::chrono::duration<double>(clock::now() - busy_since_).count();
    if (o->failure) std::rethrow_exception(o->failure);
    counters_->items += 1;
    counters_->bytes += o->result.request.length;
    co_await out.send(std::move(o->result));
  }

  // Reads the request's range, resuming short reads. With an aligned source
  // (O_DIRECT) the read window is widened to the alignment inside the slot.
  static task<void> read_one(Source* src, std::shared_ptr<op> o) {
    auto& r = o->result;
    const auto& req = r.request;
    if (req.mapped) {
      if constexpr (requires { src->map(req.file, req.offset, req.length); }) {
        try {
          r.hold = co_await src->map(req.file, req.offset, req.length);
        } catch (const truncated_error& e) {  // name the tensor, which the source does not know
          throw truncated_error(e.detail(), {e.file(), req.pieces.empty() ? std::string{} : req.pieces.front().tensor->name,
                                             e.range()},
                                e.code());
        }
        r.data = r.hold.bytes();
        co_return;
      } else {
        throw usage_error("a mapped read request for a source without page-cache views");
      }
    }
    std::uint64_t begin = req.offset, end = req.end();
    std::span<std::byte> buf;
    if (!req.direct.empty()) {
      buf = req.direct;
    } else {
      auto slot = r.hold.bytes();
      if constexpr (requires { src->direct_alignment(req.file); }) {
        if (const std::uint64_t a = src->direct_alignment(req.file)) {
          const auto b = begin / a * a, e = (end + a - 1) / a * a;
          if (e - b <= slot.size()) begin = b, end = e;
        }
      }
      if (end - begin > slot.size())
        throw config_error(fmt::format("read request of {} bytes does not fit a {}-byte staging slot", end - begin, slot.size()));
      buf = slot.first(end - begin);
    }
    const std::uint64_t need = req.end() - begin;  // bytes that must arrive (the aligned tail may be past EOF)
    std::uint64_t got = 0;
    while (got < need) {
      std::size_t n = 0;
      if constexpr (requires { src->read_via_page_cache(req.file, begin, buf); }) {
        n = req.via_page_cache ? co_await src->read_via_page_cache(req.file, begin + got, buf.subspan(got))
                               : co_await src->read_at(req.file, begin + got, buf.subspan(got));
      } else {
        n = co_await src->read_at(req.file, begin + got, buf.subspan(got));
      }
      if (n == 0) {
        const auto* t = req.pieces.empty() ? nullptr : req.pieces.front().tensor;
        for (const auto& p : req.pieces)  // name the tensor the file ends in
          if (p.tensor->offset + p.tensor_offset + p.length > begin + got) { t = p.tensor; break; }
        throw truncated_error(fmt::format("file ended after {} of {} bytes", begin + got - req.offset, req.length),
                              {src->file_uri(req.file), t ? t->name : std::string{}, byte_range{req.offset, req.end()}});
      }
      got += n;
    }
    r.data = buf.subspan(req.offset - begin, req.length);
  }

  Source* src_;
  staging_pool* pool_;
  fetch_options opt_;
  unsigned in_flight_ = 0;
  clock::time_point busy_since_{};
  std::shared_ptr<step_counters> counters_ = std::make_shared<step_counters>();  // survives moves into a pipeline
};

}  // namespace sluice::inline v0
