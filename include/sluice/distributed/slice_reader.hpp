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
#include <map>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/error.hpp>
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

/// A batch of planned reads: each an extent of a tensor (a plan slice) whose
/// `direct` span is where its bytes go (a window buffer or the shared segment).
using planned_reads = std::vector<byte_extent>;

/// The data path of a distributed load. `read(reads)` reads every extent of
/// the batch into its destination and returns once all arrived; on failure it
/// throws the first error (naming the file or object and the range) after
/// every read of the batch has completed, so no destination is written after
/// it returns. `counters().bytes_read` is what storage delivered
/// (distributed_stats::storage_bytes). A reader may also report
/// `connections()` (distributed_stats::connections). One thread uses it.
template <class R>
concept slice_reader = requires(R& r, const R& cr, planned_reads& reads) {
  { r.read(reads) } -> std::same_as<void>;
  { cr.counters() } -> std::same_as<const io_counters&>;
};

/// A slice_reader behind a virtual interface, so that the distributed driver
/// is compiled once for every reader (local files, S3, a test's own).
class any_slice_reader {
 public:
  virtual ~any_slice_reader() = default;
  virtual void read(planned_reads& reads) = 0;
  [[nodiscard]] virtual const io_counters& counters() const noexcept = 0;
  /// Connections of an S3 reader's client; 0 for readers without any.
  [[nodiscard]] virtual std::size_t connections() const noexcept { return 0; }
  /// Reads (or GETs) in flight at most; 0 for readers that do not say.
  [[nodiscard]] virtual unsigned queue_depth() const noexcept { return 0; }

  /// Owns `r` behind this interface.
  template <slice_reader R>
  [[nodiscard]] static std::unique_ptr<any_slice_reader> wrap(std::unique_ptr<R> r);
};

namespace detail {
template <slice_reader R>
class slice_reader_holder final : public any_slice_reader {
 public:
  explicit slice_reader_holder(std::unique_ptr<R> r) : r_(std::move(r)) {}
  void read(planned_reads& reads) override { r_->read(reads); }
  [[nodiscard]] const io_counters& counters() const noexcept override { return r_->counters(); }
  [[nodiscard]] std::size_t connections() const noexcept override {
    if constexpr (requires(const R& x) { x.connections(); })
      return r_->connections();
    else
      return 0;
  }
  [[nodiscard]] unsigned queue_depth() const noexcept override {
    if constexpr (requires(const R& x) { x.queue_depth(); })
      return r_->queue_depth();
    else
      return 0;
  }

 private:
  std::unique_ptr<R> r_;
};
}  // namespace detail

template <slice_reader R>
std::unique_ptr<any_slice_reader> any_slice_reader::wrap(std::unique_ptr<R> r) {
  if (!r) return nullptr;
  return std::make_unique<detail::slice_reader_holder<R>>(std::move(r));
}

namespace detail {

// Copies staged views into the destination of the extent they belong to
// (extents read straight into their destination arrive as `placed`).
struct destination_sink {
  // (tensor, extent offset) -> destination of the extent
  std::map<std::pair<const tensor_ref*, std::uint64_t>, std::span<std::byte>> dest;
  bool accept(tensor_view v) {
    if (v.kind != view_kind::bytes || v.bytes.empty()) return true;
    auto it = dest.upper_bound({v.tensor, v.offset});
    if (it == dest.begin() || std::prev(it)->first.first != v.tensor)
      throw usage_error(fmt::format("a slice reader got bytes at {} of tensor {} outside every planned extent", v.offset, v.tensor->name), {"", v.tensor->name});
    --it;
    const auto at = v.offset - it->first.second;
    std::memcpy(it->second.data() + at, v.bytes.data(), v.bytes.size());
    return true;
  }
};

template <source Source>
[[nodiscard]] task<void> read_into(std::vector<byte_extent> jobs, Source& src, destination_sink& s, staging_pool& pool,
                                   load_options opt) {
  auto pipeline = coalesce({request_bytes_for(opt.max_read, pool.slot_size())}) | fetch<Source>(src, pool, {opt.queue_depth}) | stage({false}) |
                  place<destination_sink>(s);
  co_await run_pipeline(pipeline, jobs, [](const placement&) {}, opt.stop);
}

// Reads a batch through coalesce | fetch | stage | place on `ioc`, run by the
// calling thread (one thread: the pipeline and the source share it). Extents
// of `stage_below` bytes or more are read straight into their destination;
// smaller ones into a staging slot, merged with file-adjacent ones into one
// request (up to max_read), and copied out.
template <source Source>
void read_slices(asio::io_context& ioc, Source& src, staging_pool& pool, const load_options& opt, planned_reads& reads,
                 std::uint64_t stage_below = 0) {
  destination_sink sink;
  std::vector<byte_extent> jobs;
  jobs.reserve(reads.size());
  for (auto x : reads) {
    if (!x.size) continue;
    sink.dest.emplace(std::pair{x.tensor, x.offset}, x.direct);
    if (x.size < stage_below) x.direct = {};
    jobs.push_back(x);
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
