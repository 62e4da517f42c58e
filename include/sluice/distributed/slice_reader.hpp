#pragma once
/// \file
/// The data path of a distributed load, written once over any backend's
/// source (catalog::open_source): a `slice_reader` reads a batch of planned
/// byte ranges straight into their destinations, through
/// coalesce | fetch | stage | place, as a task on the driver's io_context
/// (the executor its source was opened on).

#include <utility>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <vector>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>
#include <sluice/load.hpp>
#include <sluice/source/any_source.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/stages/coalesce.hpp>
#include <sluice/stages/fetch.hpp>
#include <sluice/stages/pipeline.hpp>
#include <sluice/stages/place.hpp>
#include <sluice/stages/stage.hpp>

namespace sluice::inline v0 {

/// A batch of planned reads: each an extent of a tensor (a plan slice) whose
/// `direct` span is where its bytes go (a window buffer or the shared segment),
/// or, with `map` set, which comes back as a view of the page cache
/// (slice_reader::read's `views`).
using planned_reads = std::vector<byte_extent>;

namespace detail {

// Copies staged views into the destination of the extent they belong to
// (extents read straight into their destination arrive as `placed`).
struct destination_sink {
  // (tensor, extent offset) -> destination of the extent
  std::map<std::pair<const tensor_ref*, std::uint64_t>, std::span<std::byte>> dest;
  // (tensor, extent offset) -> where a mapped extent's view goes
  std::map<std::pair<const tensor_ref*, std::uint64_t>, lease*> views;
  bool accept(tensor_view v) {
    if (v.kind != view_kind::bytes || v.bytes.empty()) return true;
    if (auto m = views.find({v.tensor, v.offset}); m != views.end()) {  // a mapped extent arrives whole, as one view
      *m->second = std::move(v.hold);
      return true;
    }
    auto it = dest.upper_bound({v.tensor, v.offset});
    if (it == dest.begin() || std::prev(it)->first.first != v.tensor)
      throw usage_error(fmt::format("a slice reader got bytes at {} of tensor {} outside every planned extent", v.offset, v.tensor->name), {"", v.tensor->name});
    --it;
    const auto at = v.offset - it->first.second;
    std::memcpy(it->second.data() + at, v.bytes.data(), v.bytes.size());
    return true;
  }
};


// Every read of a distributed load has a destination (the segment or a
// window buffer): a reader's pool only needs slots for the reads it stages
// (`slots`, at least 2), not the whole budget.
inline staging_options reader_staging(const load_options& opt, std::size_t slots = 2) {
  const auto slot = slot_size_for(opt.max_read);
  return {std::min(opt.staging_budget, std::max<std::size_t>(2, slots) * slot), slot, opt.poison};
}

}  // namespace detail

/// Reads batches of planned slices through one source (the catalog's
/// open_source, or a test's own). `read(reads)` reads every extent of the
/// batch into its destination and completes once all arrived; on failure it
/// throws the first error (naming the file or object and the range) after
/// every read of the batch has completed, so no destination is written after
/// it returns. Extents of the source's stage_below() bytes or more are read
/// straight into their destination; smaller ones into a staging slot (one per
/// connection, at least two), merged with file-adjacent ones into one request
/// (up to max_read), and copied out. Up to the source's queue_depth() reads
/// are in flight (or load_options::queue_depth, if larger). A stop
/// (`opt.stop`) ends a batch with cancelled_error and cancels the source's
/// reads in flight. Its reads run on the executor of the coroutine that
/// awaits read() (the one its source was opened on). Batches may overlap (a
/// distributed load's window reads and its delivery's, deliver_window): each
/// has its own reads in flight, and they share the source and the slots.
class slice_reader {
 public:
  slice_reader(std::unique_ptr<any_source> src, const load_options& opt)
      : opt_(opt), src_(std::move(src)),
        pool_(detail::reader_staging(opt, std::max<std::size_t>({2, src_->connections(), opt.queue_depth, src_->queue_depth()}))) {
    opt_.queue_depth = std::max(opt_.queue_depth, src_->queue_depth());
    if (opt.register_buffers) src_->register_buffers(pool_);
    if (opt_.stop.stop_possible()) on_stop_.emplace(opt_.stop, cancel_reads{src_.get()});
  }
  slice_reader(const slice_reader&) = delete;
  slice_reader& operator=(const slice_reader&) = delete;

  /// Reads the batch (see above). `reads` must stay valid until it
  /// completes. An extent with `map` set (the caller asked the source's
  /// can_map) is not read but mapped: its view of the page cache lands in
  /// (*views)[k], k its index in `reads` (`views` as long as `reads`).
  [[nodiscard]] task<void> read(const planned_reads& reads, std::vector<lease>* views = nullptr) {
    detail::destination_sink sink;
    std::vector<byte_extent> jobs;
    jobs.reserve(reads.size());
    const auto stage_below = src_->stage_below();
    for (std::size_t k = 0; k < reads.size(); ++k) {
      auto x = reads[k];
      if (!x.size) continue;
      if (x.map) {
        if (!views || views->size() != reads.size()) throw usage_error("slice_reader::read: a mapped extent and nowhere for its view");
        sink.views.emplace(std::pair{x.tensor, x.offset}, &(*views)[k]);
        jobs.push_back(x);
        continue;
      }
      sink.dest.emplace(std::pair{x.tensor, x.offset}, x.direct);
      if (x.size < stage_below || staged_for_direct_io(x)) x.direct = {};
      jobs.push_back(x);
    }
    if (jobs.empty()) co_return;
    auto pipeline = coalesce({request_bytes_for(opt_.max_read, pool_.slot_size()), src_->read_alignment()}) |
                    fetch<any_source>(*src_, pool_, {opt_.queue_depth}) | stage({false}) |
                    place<detail::destination_sink>(sink);
    co_await run_pipeline(pipeline, jobs, [](const placement&) {}, opt_.stop);
  }

  [[nodiscard]] const io_counters& counters() const noexcept { return src_->counters(); }
  /// Extents read through a staging slot rather than straight into their
  /// destination, for O_DIRECT's alignment (staged_for_direct_io).
  [[nodiscard]] std::uint64_t realigned() const noexcept { return realigned_; }
  /// Connections of its source's client (S3); 0 for sources without any.
  [[nodiscard]] std::size_t connections() const noexcept { return src_->connections(); }
  /// Reads (or GETs) in flight at most.
  [[nodiscard]] unsigned queue_depth() const noexcept { return opt_.queue_depth; }
  [[nodiscard]] any_source& source() noexcept { return *src_; }

 private:
  // Whether an extent bound for its destination goes through a slot instead:
  // where the source would read its range past the page cache (O_DIRECT:
  // direct_alignment_at) but the extent's file range or destination is not
  // aligned to it, a read straight into the destination would fall back to a
  // buffered read (the kernel's copy, and a page-cache page to make for every
  // 4 KiB: a lone rank's cold load of the 8 GiB sample took 10.8 s of CPU for
  // 8.8 s), while a staged read is widened to the alignment, read O_DIRECT,
  // and copied out once. Not where the source would read the range through
  // the page cache anyway (its own rule, direct_alignment_at: under
  // io=automatic, the range mostly cached), nor where every byte of it is
  // cached (io=direct too: a buffered read of cached pages fills nothing),
  // for a buffered read into the destination is then the one copy, where a
  // slot would add a second.
  [[nodiscard]] bool staged_for_direct_io(const byte_extent& x) {
    const std::uint64_t a = x.via_page_cache ? 0 : src_->direct_alignment(x.tensor->shard);
    if (!a) return false;
    const auto off = x.file_offset();
    if (direct_io_aligned(a, off, x.size, x.direct.data())) return false;
    if (!src_->direct_alignment_at(x.tensor->shard, off, x.size) || src_->cached(x.tensor->shard, off, x.size)) return false;
    ++realigned_;
    return true;
  }

  struct cancel_reads {
    any_source* src;
    void operator()() const { src->cancel(); }
  };

  load_options opt_;
  std::unique_ptr<any_source> src_;
  staging_pool pool_;
  std::uint64_t realigned_ = 0;
  std::optional<std::stop_callback<cancel_reads>> on_stop_;  // last: gone before src_
};

}  // namespace sluice::inline v0
