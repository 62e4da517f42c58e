#pragma once
/// \file
/// The data path of a distributed load: a `slice_reader` reads a batch of
/// planned byte ranges straight into their destinations, through
/// coalesce | fetch | stage | place on an io_context it owns.

#include <utility>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/core/run.hpp>
#include <sluice/core/staging_pool.hpp>
#include <sluice/load.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/stages/coalesce.hpp>
#include <sluice/stages/fetch.hpp>
#include <sluice/stages/pipeline.hpp>
#include <sluice/stages/place.hpp>
#include <sluice/stages/stage.hpp>

namespace sluice::inline v0 {

/// A batch of planned reads: each a byte range of a shard (a tensor_ref of
/// its own: a slice of a tensor is read like a tensor) and where its bytes go.
using planned_reads = std::vector<std::pair<tensor_ref, std::span<std::byte>>>;

/// The data path of a distributed load. `read(reads)` reads every range of
/// the batch straight into its destination and returns once all arrived;
/// on failure it throws the first error (naming the file or object and the
/// range) after every read of the batch has completed, so no destination is
/// written after it returns. `counters().bytes_read` is what storage
/// delivered (distributed_stats::storage_bytes). A reader may also report
/// `connections()` (distributed_stats::connections). One thread uses it.
template <class R>
concept slice_reader = requires(R& r, const R& cr, planned_reads& reads) {
  { r.read(reads) } -> std::same_as<void>;
  { cr.counters() } -> std::same_as<const io_counters&>;
};

namespace detail {

// Copies staged views into their destination (direct reads arrive as `placed`).
struct destination_sink {
  std::unordered_map<const tensor_ref*, std::span<std::byte>> dest;
  bool accept(tensor_view v) {
    if (v.kind != view_kind::bytes || v.bytes.empty()) return true;
    auto d = dest.at(v.tensor);
    std::memcpy(d.data() + v.offset, v.bytes.data(), v.bytes.size());
    return true;
  }
};

template <source Source>
[[nodiscard]] task<void> read_into(std::vector<tensor_job> jobs, Source& src, destination_sink& s, staging_pool& pool,
                                   load_options opt) {
  const std::uint64_t max_read = std::min<std::uint64_t>(opt.max_read, pool.slot_size() - 2 * 4096);
  auto pipeline = coalesce({max_read ? max_read : 4096}) | fetch<Source>(src, pool, {opt.queue_depth}) | stage({false}) |
                  place<destination_sink>(s);
  co_await run_pipeline(pipeline, jobs, [](const placement&) {}, opt.stop);
}

// Reads a batch through coalesce | fetch | stage | place on `ioc`, run by the
// calling thread (one thread: the pipeline and the source share it). Ranges
// of `stage_below` bytes or more are read straight into their destination;
// smaller ones into a staging slot, merged with file-adjacent ones into one
// request (up to max_read), and copied out.
template <source Source>
void read_slices(asio::io_context& ioc, Source& src, staging_pool& pool, const load_options& opt, planned_reads& reads,
                 std::uint64_t stage_below = 0) {
  destination_sink sink;
  std::vector<tensor_job> jobs;
  jobs.reserve(reads.size());
  for (auto& [ref, dst] : reads) {
    sink.dest.emplace(&ref, dst);
    jobs.push_back({&ref, ref.size < stage_below ? std::span<std::byte>{} : dst});
  }
  if (jobs.empty()) return;
  run_blocking(ioc, read_into(std::move(jobs), src, sink, pool, opt));
}

// Every read of a distributed load has a destination (the segment or a
// window buffer): a reader's pool only needs slots for the reads it stages
// (`slots`, at least 2), not the whole budget.
inline staging_options reader_staging(const load_options& opt, std::size_t slots = 2) {
  const auto slot = slot_size_for(opt.max_read);
  return {std::min(opt.staging_budget, std::max<std::size_t>(2, slots) * slot), slot, opt.poison};
}


}  // namespace detail

}  // namespace sluice::inline v0
