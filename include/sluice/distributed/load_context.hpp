#pragma once
/// \file
/// What the window stages of one distributed load share (read_window |
/// exchange_window | deliver_window): the checkpoint, the plan, the sink, the
/// reader, the node's shared segment, this rank's statistics, its failures
/// not yet reported to its peers, and the window credits that bound the
/// memory in flight. All of it is used on the driver's thread only; the
/// exchange stage hands its own thread copies, never the context.

#include <cstdint>
#include <exception>
#include <variant>

#include <memory>

#include <boost/asio/io_context.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/core/run.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/sink/any_sink.hpp>

namespace sluice::inline v0::detail {

// A slice reader on an io_context of its own, run by the calling thread.
class blocking_reader {
 public:
  blocking_reader(const source_factory& open, const reader_sizing& sizing, const load_options& opt)
      : ioc_(std::make_unique<asio::io_context>(1)), reader_(open(*ioc_, sizing), opt) {}
  void read(planned_reads& reads) { run_blocking(*ioc_, reader_.read(reads)); }
  [[nodiscard]] const io_counters& counters() const noexcept { return reader_.counters(); }
  [[nodiscard]] std::size_t connections() const noexcept { return reader_.connections(); }
  [[nodiscard]] unsigned queue_depth() const noexcept { return reader_.queue_depth(); }

 private:
  std::unique_ptr<asio::io_context> ioc_;  // before the reader: destroyed after it
  slice_reader reader_;
};

template <device_lane Lane>
struct load_context {
  const checkpoint& ck;
  const policy::load_plan& plan;
  const distributed_options& opt;
  Lane& lane;
  any_sink sink;
  blocking_reader& reader;
  const memory::shared_host& segment;
  window_buffers& buffers;
  policy::rank_t me;
  distributed_stats& st;
  /// This rank's first failure (a read, a delivery) not yet reported: the
  /// next status exchange reports it, and every rank then throws.
  std::exception_ptr failure;
  /// Window buffer sets free to read into: read_window takes one per window,
  /// deliver_window gives it back once the window's views are delivered. Two
  /// let window w+1 be read while w travels; one reads serially.
  channel<std::monostate> credits{2};
  std::uint64_t fetched = 0;  ///< tensor bytes this rank read (shared tables included)

  void fail(std::exception_ptr e) noexcept {
    if (!failure) failure = std::move(e);
  }
  /// Reads a batch through the reader, counting its bytes.
  void read(planned_reads& reads) {
    for (const auto& r : reads) fetched += r.size;
    reader.read(reads);
  }
};

}  // namespace sluice::inline v0::detail
