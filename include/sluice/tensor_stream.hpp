#pragma once
/// \file
/// `tensor_stream`: a checkpoint's tensors pulled one at a time, from a load
/// that runs on a thread of its own and never runs ahead of the consumer by
/// more than the staging budget.
///
///     tensor_stream s(ck, {.load = {.staging_budget = 1 << 30}});
///     s.start();
///     while (auto t = s.next()) use(t->view);  // zero-copy: t holds its bytes
///
/// Memory. The budget is split once, from the checkpoint's tensors
/// (stream_memory_plan): a staging pool, whose slots hold the tensors a slot
/// can hold, and the bytes for tensors larger than a slot, each read straight
/// into a buffer of its own. The load's fetch asks the stream's gate before
/// each read (stages/admission.hpp), so:
/// - the bytes read but not yet handed out (`ahead`) stay within the budget,
///   and the own buffers, ahead or held by the consumer, within their share;
/// - a tensor larger than that share is read alone: only once nothing else is
///   ahead and the consumer holds no own buffer (or waits in next(), having
///   nothing else to drop), and nothing else is read until it is handed out;
/// - at small budgets the slots shrink (the pool keeps 2 x queue_depth of
///   them), so reads still overlap.
/// - a tensor of 1 MiB or more (or larger than a slot) whose bytes are mostly
///   in the page cache is handed out as a view of the page cache instead
///   (`map_cached`; load_options::map_above): no copy and no memory of its
///   own, the fresh memory that a hot load in a new process would otherwise
///   pay to fault in. It is admitted as a tensor of its own would be, counts
///   as ahead until handed out, and never pins a slot.
/// Tensors the consumer holds pin their slots (a slot is reused only when
/// every tensor in it is gone). When pinning one more would leave the load
/// fewer than queue_depth free slots, the tensor is copied out into memory of
/// its own (`copied_out`), or resource_error is raised (on_exhausted::raise).
///
/// Threads. next() may be called from one thread at a time; stream_tensor may
/// be destroyed on any thread (it only touches the stream's shared state).
/// stop() and the destructor stop the load and wait for it: every slot and
/// buffer not held by a stream_tensor is returned. A stop while the load
/// waits in the gate or in the queue ends it with cancelled_error.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>

#include <sluice/checkpoint.hpp>
#include <sluice/load.hpp>
#include <sluice/memory/memory_cache.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

/// What a stream does when the tensors the consumer holds would leave the
/// load no slot to read into.
enum class on_exhausted : std::uint8_t {
  copy,   ///< hand the next tensors out as copies in memory of their own
  raise,  ///< fail the load with resource_error naming the budget
};

/// How a stream splits its budget (computed once, before the load).
struct stream_memory_plan {
  std::size_t budget = 0;      ///< bytes ahead of the consumer at most
  std::size_t slot_size = 0;   ///< bytes per staging slot
  std::size_t pool_bytes = 0;  ///< the staging pool's budget (slot_count * slot_size)
  std::size_t own_bytes = 0;   ///< for tensors larger than a slot (ahead + held); budget - pool_bytes
  std::uint64_t own_min = 0;   ///< tensors of more bytes than this get a buffer of their own

  /// The plan for `budget`, `max_read`-byte reads and `queue_depth` reads in
  /// flight over `ck`'s tensors. The slot is slot_size_for(max_read), or
  /// smaller when the pool would hold fewer than 2 x queue_depth of them
  /// (not below 16 KiB). When some tensor is larger than a slot's read
  /// (request_bytes_for), the pool gets half the budget and the own buffers
  /// the rest; else the pool gets all of it.
  [[nodiscard]] static stream_memory_plan make(std::size_t budget, std::uint64_t max_read, unsigned queue_depth,
                                               const checkpoint& ck);
};

/// The stream's counters (stats()).
struct stream_stats {
  load_stats load;                       ///< the load's summary (valid once the stream ended)
  stream_memory_plan plan;
  std::uint64_t copied_out = 0;          ///< tensors copied out of their slot (on_exhausted::copy)
  std::uint64_t copied_out_bytes = 0;
  std::uint64_t own_tensors = 0;         ///< tensors read into a buffer of their own (larger than a slot)
  std::uint64_t own_tensor_bytes = 0;
  std::uint64_t read_alone = 0;          ///< of which larger than own_bytes: read with nothing else ahead
  std::uint64_t mapped_tensors = 0;      ///< tensors handed out as page-cache views (map_cached)
  std::uint64_t mapped_bytes = 0;
  std::uint64_t peak_ahead_bytes = 0;    ///< most tensor bytes read (or reading) and not yet handed out
  std::uint64_t peak_own_bytes = 0;      ///< most bytes of own buffers ahead or held at once
  std::uint64_t gate_waits = 0;          ///< reads the gate held back
  std::uint64_t full_waits = 0;          ///< times the load found the queue full (it waits until half is taken)
  std::uint64_t skipped = 0;             ///< tensors stream_options::skip kept from the queue
};

struct stream_options {
  /// The load: staging_budget is the stream's budget; max_read, queue_depth,
  /// threads, io as for load(). `stop`, `progress` and `admit` are the
  /// stream's own (set them through stop() and progress()).
  load_options load;
  std::size_t queue = 8;                 ///< tensors queued for next() at most
  on_exhausted exhausted = on_exhausted::copy;
  /// Hand tensors of 1 MiB or more (and any larger than a slot) out as views
  /// of the page cache where their bytes are mostly cached (sets
  /// load.map_above when it is 0). The views are private mappings of the
  /// files: see file_source::map.
  bool map_cached = true;
  /// Where the pool and the own buffers come from and go back to between
  /// loads; null: memory_cache::process(). Must outlive the stream.
  memory_cache* cache = nullptr;
  /// Tensors next() never hands out (e.g. another rank's placeholders the
  /// consumer does not want): the sink takes them without queueing, so
  /// they cost neither a place in the queue nor a wake of the consumer.
  /// Called on the load thread; empty: every tensor is handed out.
  std::function<bool(const tensor_view&)> skip;
};

namespace detail {
struct stream_state;
}

/// A tensor handed out by a stream: its view (bytes valid while this lives)
/// and the accounting it holds (its slot pin, its own buffer). Move-only;
/// destroy it on any thread.
class stream_tensor {
 public:
  stream_tensor() = default;
  stream_tensor(stream_tensor&&) noexcept;
  stream_tensor& operator=(stream_tensor&&) noexcept;
  ~stream_tensor();

  tensor_view view;  ///< whole tensor; `view.hold` owns the bytes

  /// Releases the bytes and the accounting now.
  void reset() noexcept;
  /// Whether holding it holds the stream's staging: a pinned slot or an own
  /// buffer counted against the budget. False for a page-cache view (and an
  /// empty tensor): the consumer may keep it for good at no cost to the load.
  [[nodiscard]] bool holds_staging() const noexcept { return slot_ >= 0 || own_ > 0; }

 private:
  friend class tensor_stream;
  std::shared_ptr<detail::stream_state> state_;
  int slot_ = -1;             // staging slot pinned (-1: none)
  std::size_t own_ = 0;       // bytes of own buffer held against the budget
};

/// What next(timeout) found.
enum class pull_status : std::uint8_t { tensor, end, timeout };

class tensor_stream {
 public:
  /// Runs `ck`'s load through its catalog (load(ck, sink, pool, opt)).
  /// Throws config_error for a budget that cannot hold a slot.
  tensor_stream(std::shared_ptr<const checkpoint> ck, stream_options opt);
  /// A stream over a load of the caller's: `run(sink, opt)` loads into the
  /// sink (e.g. a distributed load whose views are in window buffers; the
  /// caller keeps its stats). No pool, gate or budget of the stream's: views
  /// are queued as they come (at most `opt.queue`).
  using producer = std::function<void(any_sink, const load_options&)>;
  tensor_stream(producer run, stream_options opt);
  ~tensor_stream();
  tensor_stream(const tensor_stream&) = delete;
  tensor_stream& operator=(const tensor_stream&) = delete;

  /// Starts the load thread. Throws usage_error when called twice.
  void start();
  /// The next tensor, waiting for it; nullopt at the end. Throws the load's
  /// error (once the load has ended), cancelled_error after stop().
  [[nodiscard]] std::optional<stream_tensor> next();
  /// As next(), waiting `timeout` at most: `out` receives the tensor when
  /// the status is `tensor`. For callers that must run something while they
  /// wait (Python's signal handlers).
  [[nodiscard]] pull_status next(std::chrono::milliseconds timeout, stream_tensor& out);
  /// Stops the load and waits for it. Queued tensors are dropped; tensors
  /// handed out keep their bytes.
  void stop();
  /// The consumer failed: the load's next sink call (or gate wait) throws
  /// `e` (a distributed load then fails every rank, naming this one). Waits
  /// for the load to end.
  void fail(std::exception_ptr e);
  /// Whether the load has ended (next() would return without waiting).
  [[nodiscard]] bool done() const;
  [[nodiscard]] stream_stats stats() const;
  /// Live progress of the load.
  [[nodiscard]] const load_progress& progress() const noexcept { return progress_; }
  /// The staging pool (null for a producer's stream). Once the load has
  /// ended (next() returned the end, or stop()) the pool is back in the
  /// memory cache, and the next stream may be using it.
  [[nodiscard]] const staging_pool* pool() const noexcept;
  /// Slots pinned by tensors handed out (queued or alive).
  [[nodiscard]] std::size_t pinned_slots() const;
  /// CPU seconds the process used while the load ran (user + system).
  [[nodiscard]] double cpu_seconds() const;

 private:
  void body();
  void return_pool() noexcept;
  std::shared_ptr<const checkpoint> ck_;
  producer run_;
  stream_options opt_;
  std::shared_ptr<detail::stream_state> st_;
  std::shared_ptr<staging_pool> pool_;
  std::atomic<bool> pool_returned_{false};  // next() and stop() may race to return it
  load_progress progress_;
  std::thread thread_;
};

}  // namespace sluice::inline v0
