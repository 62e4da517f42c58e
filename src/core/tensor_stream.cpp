// tensor_stream (tensor_stream.hpp): the queue between the load thread and
// next(), the slot pins, and the gate fetch asks before each read.

#include <utility>  // before Asio (Boost 1.74)

#include <sluice/tensor_stream.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stop_token>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <sluice/core/detail/waiter.hpp>
#include <sluice/error.hpp>
#include <sluice/load_file.hpp>
#include <sluice/stages/admission.hpp>

#include "thread_name.hpp"

namespace sluice::inline v0 {

namespace {
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
}  // namespace

stream_memory_plan stream_memory_plan::make(std::size_t budget, std::uint64_t max_read, unsigned queue_depth,
                                            const checkpoint& ck) {
  const std::size_t want = slot_size_for(max_read);
  const std::size_t reads = std::max(1u, queue_depth);
  // A pool of `pool` bytes keeps queue_depth reads in flight and as many
  // slots again for the tensors queued or held: below queue_depth + 2 slots
  // of the size max_read asks, the slots shrink to pool / (2 x queue_depth).
  const auto slot_for = [&](std::size_t pool) {
    if (pool / want >= reads + 2) return want;
    return std::max<std::size_t>(std::size_t{16} << 10, pool / (2 * reads) / 4096 * 4096);
  };
  const auto any_larger = [&](std::uint64_t chunk) {
    return std::any_of(ck.tensors().begin(), ck.tensors().end(), [&](const tensor_ref& t) { return t.size > chunk; });
  };
  stream_memory_plan p;
  p.budget = budget;
  p.slot_size = slot_for(budget / 2);
  p.own_min = request_bytes_for(max_read, p.slot_size);
  if (any_larger(p.own_min)) {
    p.pool_bytes = budget / 2 / p.slot_size * p.slot_size;
  } else {  // nothing needs a buffer of its own: the pool gets the whole budget
    p.slot_size = slot_for(budget);
    p.own_min = request_bytes_for(max_read, p.slot_size);
    p.pool_bytes = budget / p.slot_size * p.slot_size;
  }
  p.own_bytes = budget - p.pool_bytes;
  return p;
}

namespace detail {

struct stream_state final : admission {
  struct queued {
    tensor_view view;
    int slot = -1;
    std::size_t own = 0;       // bytes of own buffer (held once handed out)
    bool alone = false;
  };
  struct own_buffer {
    lease hold;
    std::uint64_t filled = 0;
    bool alone = false;
  };

  std::mutex mu;
  // Two sides, each woken only when the other changed what it waits for:
  // a wake is two context switches, and with one per tensor a load of a few
  // thousand tensors on ranks sharing cores spent more time switching than
  // handing out (bench/HISTORY.md, the peers race's ranks row).
  std::condition_variable items;  // next(): an item, the end
  std::condition_variable room;   // the sink: room in the queue, pins dropped, the consumer waiting; both: a stop
  std::deque<queued> queue;
  std::size_t capacity = 8;
  bool producer_waiting = false;  // the sink waits on `room`
  std::function<bool(const tensor_view&)> skip;  // stream_options::skip
  std::atomic<std::uint64_t> skipped{0};          // by it (no lock: the load thread alone)
  bool done = false;
  std::exception_ptr error, consumer_error;
  std::stop_source stop;

  // Slot pins: pins[slot] tensors handed out (queued or alive) in the slot.
  const staging_pool* pool = nullptr;
  std::vector<int> pins;
  std::size_t pinned_slots = 0, pin_limit = 0;
  on_exhausted exhausted = on_exhausted::copy;

  // The gate (only for the stream's own load: `gated`).
  bool gated = false;
  stream_memory_plan plan;
  memory_cache* cache = nullptr;
  std::uint64_t ahead = 0;          // tensor bytes admitted, not yet handed out
  std::uint64_t own_ahead = 0, own_held = 0;
  bool alone_ahead = false;         // a tensor larger than own_bytes is ahead: nothing else goes
  bool consumer_waiting = false;    // next() waits on an empty queue
  std::map<const tensor_ref*, own_buffer> own;
  const tensor_ref* alone_mapped = nullptr;  // a page-cache view admitted alone, until it is queued
  detail::waiter_queue gate_waiters;

  stream_stats counters;
  double cpu0 = 0, cpu1 = -1;

  void wake_gate() noexcept { gate_waiters.wake_all(); }  // under mu
  // A full queue waits until the consumer has taken half of it: the sink
  // then queues a run of tensors per wake instead of one.
  [[nodiscard]] std::size_t low_water() const noexcept { return capacity / 2; }
  void wake_producer() noexcept {  // under mu
    if (producer_waiting) room.notify_all();
  }
  void wake_all() noexcept {  // under mu: the end, a stop, a failure
    items.notify_all();
    room.notify_all();
    wake_gate();
  }

  void release(int slot, std::size_t own_bytes) noexcept {
    std::lock_guard g(mu);
    if (slot >= 0 && --pins[static_cast<std::size_t>(slot)] == 0) --pinned_slots;
    own_held -= own_bytes;
    wake_producer();
    wake_gate();
  }

  // ---- the gate -----------------------------------------------------------

  bool is_own(const tensor_ref& t) const noexcept { return t.size > plan.own_min; }

  // `t` is let in ahead of the consumer (alone: nothing else until it is handed out).
  void count_ahead(const tensor_ref& t, bool alone) {
    ahead += t.size;
    alone_ahead = alone;
    counters.peak_ahead_bytes = std::max(counters.peak_ahead_bytes, ahead);
  }

  bool admit_locked(read_request& req) {
    if (!gated) return true;
    // A page-cache view: no memory of ours, but it counts as ahead until it
    // is handed out, so that mapping pages in never runs further ahead of the
    // consumer than the budget; one larger than the budget goes alone.
    if (req.mapped) {
      const tensor_ref* t = req.pieces.front().tensor;
      if (alone_ahead) return false;
      const bool alone = t->size > plan.budget;
      if (ahead != 0 && (alone || ahead + t->size > plan.budget)) return false;
      if (alone) alone_mapped = t;
      count_ahead(*t, alone);
      counters.mapped_tensors += 1;
      counters.mapped_bytes += t->size;
      return true;
    }
    // A tensor larger than a slot: a buffer of its own.
    if (req.pieces.size() == 1 && is_own(*req.pieces.front().tensor)) {
      const auto& p = req.pieces.front();
      const tensor_ref* t = p.tensor;
      if (auto it = own.find(t); it != own.end()) {  // a later chunk of an admitted tensor
        req.direct = it->second.hold.bytes().subspan(p.tensor_offset, p.length);
        return true;
      }
      if (alone_ahead) return false;
      const bool alone = t->size > plan.own_bytes;
      const bool ok = alone ? ahead == 0 && (own_held == 0 || consumer_waiting)
                            : own_ahead + own_held + t->size <= plan.own_bytes || (ahead == 0 && consumer_waiting);
      if (!ok) return false;
      auto hold = cache->buffer(static_cast<std::size_t>(t->size));
      // Idle buffers kept for reuse count against the own share too.
      const std::uint64_t used = own_ahead + own_held + t->size;
      cache->trim(used < plan.own_bytes ? static_cast<std::size_t>(plan.own_bytes - used) : 0);
      req.direct = hold.bytes().subspan(p.tensor_offset, p.length);
      own.emplace(t, own_buffer{std::move(hold), 0, alone});
      counters.own_tensors += 1;
      counters.own_tensor_bytes += t->size;
      counters.read_alone += alone ? 1 : 0;
      count_ahead(*t, alone);
      own_ahead += t->size;
      counters.peak_own_bytes = std::max(counters.peak_own_bytes, own_ahead + own_held);
      return true;
    }
    if (alone_ahead) return false;
    for (const auto& p : req.pieces)
      if (p.tensor_offset == 0) ahead += p.tensor->size;
    counters.peak_ahead_bytes = std::max(counters.peak_ahead_bytes, ahead);
    return true;
  }

  bool try_admit(read_request& req) override {
    std::lock_guard g(mu);
    return admit_locked(req);
  }

  task<void> admit(read_request& req) override {
    for (;;) {
      bool admitted = false;
      std::exception_ptr failure;
      co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
          [self = this, r = &req, ok = &admitted, e = &failure](auto handler) {
            std::lock_guard g(self->mu);
            try {
              if (self->consumer_error) *e = self->consumer_error;
              else if (self->stop.stop_requested()) *e = std::make_exception_ptr(cancelled_error());
              else *ok = self->admit_locked(*r);
            } catch (...) {
              *e = std::current_exception();
            }
            if (!*ok && !*e) {
              self->counters.gate_waits += 1;
              self->gate_waiters.push(std::move(handler));  // woken when the consumer takes, drops or waits
              return;
            }
            auto ex = asio::get_associated_executor(handler);
            asio::post(ex, std::move(handler));  // never resume inline
          },
          asio::use_awaitable);
      if (failure) std::rethrow_exception(failure);
      if (admitted) co_return;
    }
  }
};

}  // namespace detail

namespace {

/// The load's sink: queues whole tensors for next(). Blocks while the queue
/// is full; throws cancelled_error when stopped, the consumer's error when it
/// failed.
class queue_sink {
 public:
  static constexpr bool whole_tensors = true;
  explicit queue_sink(std::shared_ptr<detail::stream_state> st) : st_(std::move(st)) {}

  bool accept(tensor_view v) {
    auto& st = *st_;
    if (st.skip && st.skip(v)) {
      st.skipped.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    std::unique_lock l(st.mu);
    std::size_t own = 0;
    bool alone = false;
    if (v.kind == view_kind::placed) {  // a chunk read into the tensor's own buffer (the gate gave it)
      auto it = st.own.find(v.tensor);
      if (it == st.own.end()) throw usage_error("a placed view without its destination", {"", v.name()});
      it->second.filled += v.bytes.size();
      if (it->second.filled < v.tensor->size) return true;  // handed out once all of it is there
      v.hold = std::move(it->second.hold);
      v.bytes = v.hold.bytes();
      v.offset = 0;
      v.kind = view_kind::bytes;
      own = static_cast<std::size_t>(v.tensor->size);
      alone = it->second.alone;
      st.own.erase(it);
    }
    int slot = -1;
    if (st.pool && v.kind == view_kind::bytes && own == 0) slot = st.pool->slot_index(v.bytes.data());
    if (v.tensor == st.alone_mapped) {  // the page-cache view that went alone: others may go now
      alone = true;
      st.alone_mapped = nullptr;
    }
    const auto over = [&] { return slot >= 0 && st.pins[static_cast<std::size_t>(slot)] == 0 && st.pinned_slots + 1 > st.pin_limit; };
    if (over()) {
      // Pinning this slot would eat into the load's reserve. Tensors queued
      // ahead still pin slots that the consumer may drop once it has taken
      // them: wait for that. Once the queue is empty and the consumer waits
      // for more, the pins are tensors it holds, and waiting would be for
      // ever.
      st.producer_waiting = true;
      st.room.wait(l, [&] {
        return !over() || (st.queue.empty() && st.consumer_waiting) || st.stop.stop_requested() || st.consumer_error;
      });
      st.producer_waiting = false;
      if (st.consumer_error) std::rethrow_exception(st.consumer_error);
      if (st.stop.stop_requested()) throw cancelled_error();
    }
    if (over()) {
      // The consumer holds tensors in so many slots that the load would run
      // out of slots to read into and wait forever: copy this one out, or say so.
      if (st.exhausted == on_exhausted::raise)
        throw resource_error(
            fmt::format("staging budget of {} bytes ({} slots of {} bytes) exhausted: the tensors still held pin {} slots "
                        "and the load needs {} free to go on; drop tensors sooner, raise the budget, or copy them out "
                        "(on_exhausted copy)",
                        st.pool->slot_count() * st.pool->slot_size(), st.pool->slot_count(), st.pool->slot_size(),
                        st.pinned_slots, st.pool->slot_count() - st.pin_limit),
            {"", v.name()});
      l.unlock();
      auto owned = lease::allocate(v.bytes.size(), 64);
      if (!v.bytes.empty()) std::memcpy(owned.bytes().data(), v.bytes.data(), v.bytes.size());
      v.bytes = owned.bytes();
      v.hold = std::move(owned);
      slot = -1;
      l.lock();
      st.counters.copied_out += 1;
      st.counters.copied_out_bytes += v.bytes.size();
    }
    if (slot >= 0 && st.pins[static_cast<std::size_t>(slot)]++ == 0) ++st.pinned_slots;
    if (st.queue.size() >= st.capacity) {
      st.counters.full_waits += 1;
      st.producer_waiting = true;
      st.room.wait(l, [&] { return st.queue.size() <= st.low_water() || st.stop.stop_requested() || st.consumer_error; });
      st.producer_waiting = false;
    }
    if (st.consumer_error || st.stop.stop_requested()) {
      if (slot >= 0 && --st.pins[static_cast<std::size_t>(slot)] == 0) --st.pinned_slots;
      if (st.consumer_error) std::rethrow_exception(st.consumer_error);
      throw cancelled_error();
    }
    st.queue.push_back({std::move(v), slot, own, alone});
    if (st.consumer_waiting) st.items.notify_all();
    return true;
  }

 private:
  std::shared_ptr<detail::stream_state> st_;
};

}  // namespace

// ---- stream_tensor ------------------------------------------------------------

stream_tensor::stream_tensor(stream_tensor&& o) noexcept
    : view(std::move(o.view)), state_(std::move(o.state_)), slot_(std::exchange(o.slot_, -1)), own_(std::exchange(o.own_, 0)) {}

stream_tensor& stream_tensor::operator=(stream_tensor&& o) noexcept {
  if (this != &o) {
    reset();
    view = std::move(o.view);
    state_ = std::move(o.state_);
    slot_ = std::exchange(o.slot_, -1);
    own_ = std::exchange(o.own_, 0);
  }
  return *this;
}

stream_tensor::~stream_tensor() { reset(); }

void stream_tensor::reset() noexcept {
  view.hold.reset();  // the slot or buffer goes back first (to the pool, to the cache)
  view.bytes = {};
  // A view that pins no slot and holds no own buffer (the page cache's,
  // a window buffer's, a placeholder) changes nothing the load waits on:
  // no lock to take, no one to wake.
  if (auto st = std::move(state_); st && (slot_ >= 0 || own_ > 0)) st->release(slot_, own_);
  slot_ = -1;
  own_ = 0;
}

// ---- tensor_stream ------------------------------------------------------------

tensor_stream::tensor_stream(std::shared_ptr<const checkpoint> ck, stream_options opt)
    : ck_(std::move(ck)), opt_(std::move(opt)), st_(std::make_shared<detail::stream_state>()) {
  if (!ck_) throw usage_error("tensor_stream: no checkpoint");
  auto& st = *st_;
  st.capacity = std::max<std::size_t>(1, opt_.queue);
  st.exhausted = opt_.exhausted;
  st.skip = opt_.skip;
  st.cache = opt_.cache ? opt_.cache : &memory_cache::process();
  st.plan = stream_memory_plan::make(opt_.load.staging_budget, opt_.load.max_read, opt_.load.queue_depth, *ck_);
  st.counters.plan = st.plan;
  // Mapped: every tensor of 1 MiB or more (and any larger than a slot). Copying
  // a hot tensor into a slot is no faster than mapping its pages in off this
  // thread, and the slots it would fill are memory a fresh process must fault
  // in first (bench/README.md, page-cache views); the small ones are merged
  // into reads as before.
  if (opt_.map_cached && opt_.load.map_above == 0)
    opt_.load.map_above = std::min<std::uint64_t>(st.plan.own_min + 1, std::uint64_t{1} << 20);
  st.gated = true;
  pool_ = st.cache->pool(staging_options{.budget = st.plan.pool_bytes ? st.plan.pool_bytes : st.plan.budget,
                                         .slot_size = st.plan.slot_size,
                                         .poison = opt_.load.poison});
  st.cache->reserve(st.plan.own_bytes);
  st.pool = pool_.get();
  st.pins.assign(pool_->slot_count(), 0);
  st.pin_limit = pool_->slot_count() - std::clamp<std::size_t>(opt_.load.queue_depth, 1, pool_->slot_count());
}

tensor_stream::tensor_stream(producer run, stream_options opt)
    : run_(std::move(run)), opt_(std::move(opt)), st_(std::make_shared<detail::stream_state>()) {
  st_->capacity = std::max<std::size_t>(1, opt_.queue);
  st_->exhausted = opt_.exhausted;
  st_->skip = opt_.skip;
  // A producer's load (a distributed one) hands out views of the page cache
  // for what its rank keeps whole and reads or takes itself, as a load of
  // the stream's own would (read_window's map_above).
  if (opt_.map_cached && opt_.load.map_above == 0) opt_.load.map_above = std::uint64_t{1} << 20;
}

tensor_stream::~tensor_stream() { stop(); }

// Once the load has ended its pool goes back to the cache, for the next
// stream to reuse (the cache hands it out only when every slot is free), not
// when this object dies: a caller that keeps a finished stream (for its
// stats) while it starts the next one would otherwise make that one fault in
// a pool of its own. This stream keeps its pointer for pool() and slots().
void tensor_stream::return_pool() noexcept {
  if (!pool_ || pool_returned_.exchange(true)) return;
  (opt_.cache ? opt_.cache : &memory_cache::process())->put_pool(pool_);
}

void tensor_stream::start() {
  if (thread_.joinable() || st_->done) throw usage_error("this stream was already started");
  st_->cpu0 = process_cpu_seconds();
  thread_ = detail::named_thread("sluice-load", [this] { body(); });
}

void tensor_stream::body() {
  load_stats result;
  std::exception_ptr failure;
  try {
    queue_sink qs(st_);
    auto lopt = opt_.load;
    lopt.stop = st_->stop.get_token();
    lopt.progress = &progress_;
    lopt.admit = pool_ ? st_.get() : nullptr;
    if (run_) run_(any_sink(qs), lopt);
    else result = load(*ck_, qs, *pool_, lopt);
  } catch (...) {
    failure = std::current_exception();
  }
  std::lock_guard g(st_->mu);
  st_->counters.load = result;
  st_->error = failure;
  st_->done = true;
  st_->cpu1 = process_cpu_seconds();
  st_->wake_all();
}

pull_status tensor_stream::next(std::chrono::milliseconds timeout, stream_tensor& out) {
  auto& st = *st_;
  std::unique_lock l(st.mu);
  const auto ready = [&] { return !st.queue.empty() || st.done; };
  if (!ready()) {
    if (!thread_.joinable()) throw usage_error("next() on a stream that was not started");
    st.consumer_waiting = true;
    st.wake_gate();
    st.wake_producer();  // a sink waiting for pins to be dropped: they are held
    st.items.wait_for(l, timeout, ready);
    st.consumer_waiting = false;
  }
  if (!st.queue.empty()) {
    auto q = std::move(st.queue.front());
    st.queue.pop_front();
    if (st.gated) {
      st.ahead -= q.view.tensor->size;
      st.own_ahead -= q.own;
      st.own_held += q.own;
      if (q.alone) st.alone_ahead = false;
    }
    if (st.queue.size() <= st.low_water()) st.wake_producer();
    st.wake_gate();
    l.unlock();
    out.reset();
    out.view = std::move(q.view);
    out.state_ = st_;
    out.slot_ = q.slot;
    out.own_ = q.own;
    return pull_status::tensor;
  }
  if (!st.done) return pull_status::timeout;
  l.unlock();
  if (thread_.joinable()) thread_.join();
  return_pool();
  if (st.error) std::rethrow_exception(st.error);
  return pull_status::end;
}

std::optional<stream_tensor> tensor_stream::next() {
  stream_tensor t;
  for (;;) {
    switch (next(std::chrono::milliseconds(1000), t)) {
      case pull_status::tensor: return t;
      case pull_status::end: return std::nullopt;
      case pull_status::timeout: break;
    }
  }
}

void tensor_stream::stop() {
  {
    std::lock_guard g(st_->mu);
    st_->stop.request_stop();
    st_->wake_all();
  }
  if (thread_.joinable()) thread_.join();
  std::deque<detail::stream_state::queued> dropped;
  {
    std::lock_guard g(st_->mu);
    dropped.swap(st_->queue);
    for (const auto& q : dropped)
      if (q.slot >= 0 && --st_->pins[static_cast<std::size_t>(q.slot)] == 0) --st_->pinned_slots;
    st_->done = true;
  }
  dropped.clear();  // outside the lock: its leases return slots and buffers
  return_pool();
}

void tensor_stream::fail(std::exception_ptr e) {
  {
    std::lock_guard g(st_->mu);
    if (!st_->consumer_error) st_->consumer_error = e;
    st_->wake_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard g(st_->mu);
  st_->done = true;
}

bool tensor_stream::done() const {
  std::lock_guard g(st_->mu);
  return st_->done;
}

stream_stats tensor_stream::stats() const {
  std::lock_guard g(st_->mu);
  auto s = st_->counters;
  s.skipped = st_->skipped.load(std::memory_order_relaxed);
  return s;
}

const staging_pool* tensor_stream::pool() const noexcept { return pool_.get(); }

std::size_t tensor_stream::pinned_slots() const {
  std::lock_guard g(st_->mu);
  return st_->pinned_slots;
}

double tensor_stream::cpu_seconds() const {
  std::lock_guard g(st_->mu);
  return (st_->cpu1 >= 0 ? st_->cpu1 : process_cpu_seconds()) - st_->cpu0;
}

}  // namespace sluice::inline v0
