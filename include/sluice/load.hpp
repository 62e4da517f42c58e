#pragma once
/// \file
/// The one-call API: load a checkpoint into a sink through
/// coalesce | fetch | stage | place, with memory bounded by the staging budget.
///
/// `load_async` runs on the caller's executor over any `source`; `load` is the
/// blocking form for local checkpoints (io_uring file source, its own
/// io_context). Both can be stopped through `load_options::stop`: the load
/// then ends promptly with cancelled_error, every slot returned, every file
/// closed.

#include <utility>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include <nlohmann/json_fwd.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/memory/prefaulter.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/stages/coalesce.hpp>
#include <sluice/stages/fetch.hpp>
#include <sluice/stages/pipeline.hpp>
#include <sluice/stages/place.hpp>
#include <sluice/stages/stage.hpp>

namespace sluice::inline v0 {

/// Live progress of a load, readable from any thread.
struct load_progress {
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<std::uint64_t> tensors_done{0};
  std::atomic<std::uint64_t> total_bytes{0};
  std::atomic<std::uint64_t> total_tensors{0};
};

struct load_options {
  std::size_t staging_budget = std::size_t{4} << 30;   ///< bytes of staging memory at most
  std::uint64_t max_read = std::uint64_t{32} << 20;     ///< bytes per read request at most
  unsigned queue_depth = 4;                             ///< reads in flight
  unsigned threads = 1;                                 ///< io_context threads (blocking `load`)
  unsigned ring_entries = 64;                           ///< io_uring SQ entries
  io_mode io = io_mode::automatic;                      ///< O_DIRECT when aligned, required, or never
  /// Submit buffered reads with IOSQE_ASYNC: the kernel's io-wq workers copy
  /// from the page cache, so the reads in flight (queue_depth) copy on several
  /// cores. Off, the submitting thread copies each cached read inline, one
  /// after another, which is slower for hot loads (bench-local's "inline
  /// copies" rows; figures in bench/README.md).
  bool punt_buffered = true;
  /// Whether a page-cache view (map_above) whose every page is cached has
  /// its pages mapped in before it is handed out (file_source::map:
  /// MADV_POPULATE_READ, off the consumer's thread), or left to the
  /// consumer's first touches. Mapping in ahead takes more CPU time in all
  /// than the consumer's faults (the kernel faults each page in and then
  /// walks it once more), and pays only where a core is free to do it while
  /// the consumer works: `automatic` maps in where each of the node's local
  /// ranks has two hardware threads (core/cores.hpp). A view of a range not
  /// all in the page cache is always mapped in: that is its read.
  populate_mode populate_views = populate_mode::automatic;
  bool poison = SLUICE_POISON_SLOTS;                    ///< poison released slots
  /// Register the staging pool as io_uring fixed buffers. Registration pins
  /// (and so faults in) the whole budget: worth it for a pool that is reused
  /// across loads, not for a one-shot load of a fresh pool, which would first
  /// pay to fault in all of the budget, used or not (see bench/README.md).
  bool register_buffers = false;
  std::stop_token stop;                                 ///< request a stop from any thread
  load_progress* progress = nullptr;                    ///< updated as tensors are placed
  /// A gate fetch asks before each read (stages/admission.hpp): how a
  /// tensor_stream keeps the load within its budget ahead of the consumer.
  admission* admit = nullptr;
  /// Tensors of at least this many bytes that the sink does not take
  /// straight into its own memory, and whose bytes are mostly in the page
  /// cache already, are handed out as views of the page cache
  /// (file_source::map: no copy, no staging, no memory of the process's
  /// own) where the source has them (local files, not io_mode::direct).
  /// 0: never. tensor_stream sets it to the tensors larger than a slot,
  /// which would otherwise need fresh memory of their own.
  std::uint64_t map_above = 0;
  /// Where the sink's direct destinations hold at least this many bytes,
  /// fault them in on a thread of their own, from the last backwards, while
  /// the reads fill them from the first (core/prefaulter.hpp): fresh memory's
  /// first touch on two cores instead of one. 0: never.
  std::uint64_t prefault_above = prefaulter::default_min_bytes;

  /// What the source of a load with these options takes (catalog::open_source).
  [[nodiscard]] source_options source() const noexcept {
    return {queue_depth, io, ring_entries, register_buffers, punt_buffered, populate_views};
  }
};

/// What a load did.
struct load_stats {
  std::uint64_t tensors = 0;            ///< tensors delivered to the sink
  std::uint64_t accepted = 0;           ///< of which the sink accepted
  std::uint64_t tensor_bytes = 0;       ///< tensor bytes delivered
  std::uint64_t bytes_read = 0;         ///< tensor bytes this process read from storage
  std::uint64_t storage_bytes = 0;      ///< bytes the source delivered (incl. O_DIRECT alignment)
  std::uint64_t header_bytes_read = 0;  ///< bytes read to open the checkpoint
  std::uint64_t requests = 0;           ///< read requests after coalescing
  std::uint64_t files_opened = 0;
  std::size_t slot_size = 0;
  std::size_t slots = 0;
  std::size_t slots_used = 0;           ///< most slots leased at once
  std::uint64_t mapped_tensors = 0;     ///< tensors handed out as page-cache views (load_options::map_above)
  std::uint64_t mapped_bytes = 0;
  std::uint64_t prefaulted_bytes = 0;   ///< direct destinations faulted in ahead (load_options::prefault_above)
  /// The node-local cache (s3::config::cache): bytes of blocks served from
  /// it, fetched from the remote, and of those fetched again (bad blocks).
  std::uint64_t cache_hit_bytes = 0, cache_fetched_bytes = 0, cache_refetched_bytes = 0;
  double seconds = 0;                   ///< wall time of the data path
  step_counters fetch;                 ///< reads in flight (busy time)
  step_counters place;                 ///< time in the sink

  /// The load's figures under the names `sluice-load --json` prints (the tool
  /// and the Python package add the source, CPU time, peak RSS and the
  /// staging budget). Compiled in the library (src/core/load_file.cpp).
  [[nodiscard]] nlohmann::ordered_json to_json() const;
};

/// Bytes of slot needed for `max_read`-byte requests (room for O_DIRECT
/// alignment of both ends).
[[nodiscard]] constexpr std::size_t slot_size_for(std::uint64_t max_read) noexcept {
  return static_cast<std::size_t>((max_read + 4095) / 4096 * 4096 + 2 * 4096);
}

/// The largest request `coalesce` makes for `max_read` through slots of
/// `slot_size` bytes: `max_read`, but no more than a slot holds beside the
/// room for alignment (slot_size_for's inverse), and 4096 for 0. The one
/// max_read rule of every pipeline (load_async, the slice readers).
[[nodiscard]] constexpr std::uint64_t request_bytes_for(std::uint64_t max_read, std::size_t slot_size) noexcept {
  const std::uint64_t room = slot_size > 2 * 4096 ? slot_size - 2 * 4096 : 0;
  const std::uint64_t m = max_read < room ? max_read : room;
  return m ? m : 4096;
}

/// Whether `s` wants whole tensors: its compile-time choice, or the one an
/// any_sink carries.
template <sink Sink>
[[nodiscard]] bool whole_tensors_of(const Sink& s) noexcept {
  if constexpr (std::same_as<Sink, any_sink>)
    return s.whole_tensors();
  else
    return wants_whole_tensors<Sink>();
}

/// Builds the jobs of a load: every tensor, with its direct destination where
/// the sink offers one.
template <sink Sink>
[[nodiscard]] std::vector<byte_extent> whole_extents(const checkpoint& ck, Sink& s) {
  std::vector<byte_extent> jobs;
  jobs.reserve(ck.tensors().size());
  for (const auto& t : ck.tensors()) {
    auto j = byte_extent::whole(t);
    if constexpr (direct_sink<Sink>) j.direct = s.direct_destination(t);
    jobs.push_back(j);
  }
  return jobs;
}

/// Loads `ck`'s tensors from `src` into `s`, on the calling coroutine's
/// executor (keep it a strand or a one-thread io_context). `pool` is the
/// staging budget; it must outlive the load.
template <source Source, sink Sink>
[[nodiscard]] task<load_stats> load_async(const checkpoint& ck, Source& src, Sink& s, staging_pool& pool,
                                          load_options opt = {}) {
  auto ex = co_await this_executor;
  const auto t0 = std::chrono::steady_clock::now();
  load_stats st;
  st.header_bytes_read = ck.header_bytes_read();
  st.slot_size = pool.slot_size();
  st.slots = pool.slot_count();
  const auto read_before = src.counters().bytes_read.load();
  auto jobs = whole_extents(ck, s);
  if (opt.map_above) {
    if constexpr (requires(std::uint32_t f, std::uint64_t o) { src.can_map(f, o, o); }) {
      for (auto& j : jobs) {
        if (!j.direct.empty() || j.size < opt.map_above || !src.can_map(j.tensor->shard, j.file_offset(), j.size)) continue;
        j.map = true;
        st.mapped_tensors += 1;
        st.mapped_bytes += j.size;
      }
    }
  }
  if (opt.progress) {
    opt.progress->total_bytes = ck.tensor_bytes();
    opt.progress->total_tensors = ck.tensors().size();
  }
  auto fetcher = fetch<Source>(src, pool, {opt.queue_depth, opt.admit});
  auto placer = place<Sink>(s);
  const auto& fetch_counters = fetcher.counters();
  const auto& place_counters = placer.counters();
  std::uint64_t align = 0;
  if constexpr (requires { src.read_alignment(); }) align = src.read_alignment();
  auto pipeline = coalesce({request_bytes_for(opt.max_read, pool.slot_size()), align}) | std::move(fetcher) | stage({whole_tensors_of(s)}) |
                  std::move(placer);

  std::optional<prefaulter> ahead;
  if (opt.prefault_above) {
    std::vector<std::span<std::byte>> direct;  // by job, empty where staged: reached() counts tensors
    direct.reserve(jobs.size());
    for (const auto& j : jobs) direct.push_back(j.direct);
    ahead.emplace(std::move(direct), opt.prefault_above);
  }
  auto consume = [&st, &ahead, progress = opt.progress](const placement& p) {
    if (!p.last) return;
    st.tensors += 1;
    if (ahead) ahead->reached(st.tensors);
    st.accepted += p.accepted ? 1 : 0;
    st.tensor_bytes += p.tensor->size;
    if (progress) {
      progress->bytes_done.fetch_add(p.tensor->size, std::memory_order_relaxed);
      progress->tensors_done.fetch_add(1, std::memory_order_relaxed);
    }
  };
  co_await run_pipeline(pipeline, jobs, consume, opt.stop);
  if (ahead) {
    ahead->stop();
    st.prefaulted_bytes = ahead->bytes();
  }
  if constexpr (requires { s.finish(); }) s.finish();
  st.bytes_read = fetch_counters.bytes;
  st.storage_bytes = src.counters().bytes_read.load() - read_before;
  st.requests = fetch_counters.items;
  st.files_opened = src.counters().files_opened.load();
  st.cache_hit_bytes = src.counters().cache_hit_bytes.load();
  st.cache_fetched_bytes = src.counters().cache_fetched_bytes.load();
  st.cache_refetched_bytes = src.counters().cache_refetched_bytes.load();
  st.fetch = fetch_counters;
  st.place = place_counters;
  st.slots_used = pool.high_water();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  co_return st;
}

}  // namespace sluice::inline v0
