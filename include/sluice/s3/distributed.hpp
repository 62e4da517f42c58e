#pragma once
/// \file
/// How a distributed load from S3 (link sluice::s3) shares a node's
/// connections among its ranks. Call `load_distributed(...)`
/// (<sluice/distributed.hpp>) on a checkpoint opened through an
/// `s3_catalog`, or on an "s3://" location; the catalog's open_source() is
/// the data path (src/s3/open_source.cpp), and the core's slice reader
/// (distributed/slice_reader.hpp) reads each rank's planned slices through
/// it, with range GETs straight into the window buffer or the node's shared
/// segment, at the version the catalog saw: an object replaced mid-load fails with
/// s3_object_changed_error, a deleted one with s3_not_found_error — and, as
/// every rank failure does, makes every rank throw distributed_error naming
/// the rank and the object's key.
///
/// Connections: ranks on one node share its NIC, so the S3 config's
/// `max_connections` counts for the node: each rank's client gets
/// max(1, max_connections / local ranks) connections (the plan's
/// `local_size`), unless `distributed_options::connections_per_rank` sets it
/// explicitly. distributed_stats::connections records what a rank used.

#include <utility>   // before Asio (Boost 1.74)

#include <algorithm>
#include <cstddef>

#include <sluice/distributed.hpp>
#include <sluice/s3/source.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

/// Connections of one rank's S3 client: `per_rank` when non-zero, else the
/// node's `node_connections` split among its `local_ranks` (at least 1).
[[nodiscard]] constexpr std::size_t rank_connections(std::size_t node_connections, std::size_t local_ranks,
                                                     std::size_t per_rank = 0) noexcept {
  if (per_rank) return per_rank;
  return std::max<std::size_t>(1, node_connections / std::max<std::size_t>(1, local_ranks));
}

/// Connections of one rank's S3 client under `s`: the node's connections
/// (`node_connections`, or `s.connections_per_rank` x local ranks when that is
/// set) split among the ranks of the node that read at once (`s.sharers()`:
/// all local ranks for the windows; the table readers while the shared tables
/// are read), at least 1.
[[nodiscard]] constexpr std::size_t rank_connections(std::size_t node_connections, const reader_sizing& s) noexcept {
  const auto node = s.connections_per_rank ? s.connections_per_rank * std::max<std::size_t>(1, s.local_ranks) : node_connections;
  return std::max<std::size_t>(1, node / s.sharers());
}

}  // namespace sluice::inline v0
