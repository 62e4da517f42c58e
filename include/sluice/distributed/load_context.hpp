#pragma once
/// \file
/// What the window stages of one distributed load share (read_window |
/// exchange_window | deliver_window): the checkpoint, the plan and its
/// schedule (every window's layout and messages), the sink, the
/// reader, the node's shared segment, this rank's statistics, its failures
/// not yet reported to its peers, and the window credits that bound the
/// memory in flight. All of it is used on the driver's thread only; the
/// exchange stage hands its own thread copies, never the context.

#include <cstdint>
#include <exception>
#include <variant>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/policy/schedule.hpp>
#include <sluice/sink/any_sink.hpp>

namespace sluice::inline v0::detail {

template <device_lane Lane>
struct load_context {
  const checkpoint& ck;
  const policy::load_plan& plan;
  const policy::schedule& schedule;  ///< of `plan`, with this load's lanes
  const distributed_options& opt;
  Lane& lane;
  any_sink sink;
  any_slice_reader& reader;
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
