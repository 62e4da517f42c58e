#pragma once
/// \file
/// The data path of a distributed load from S3 (link sluice::s3): call
/// `load_distributed(...)` (<sluice/distributed.hpp>) on a checkpoint opened
/// through an `s3_catalog`, or on an "s3://" location; the catalog's
/// slice_reader() is an `s3_reader`. Every rank opens the checkpoint (index +
/// headers, ETags pinned) and reads only its planned slices, each with range GETs straight
/// into the window buffer or the node's shared segment, at the version the
/// catalog saw: an object replaced mid-load fails with
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
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/concepts.hpp>
#include <sluice/comm/store.hpp>
#include <sluice/distributed.hpp>
#include <sluice/s3/config.hpp>
#include <sluice/s3/source.hpp>

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

/// The S3 data path of a distributed load (a slice_reader): an `s3_source`
/// over the checkpoint's shards with its own client (`connections`
/// connections, the rest of the catalog's config), every object pinned to the
/// ETag the catalog saw, on an io_context of its own that `read` runs on the
/// calling thread. Up to 2 x `connections` GETs are in flight (as in
/// the blocking load, src/s3/load.cpp: fetch releases results in order, so depth == connections would
/// leave a connection idle behind the oldest request). Slices of
/// `staged_below` bytes or more are read straight into their destinations;
/// smaller ones through a staging slot (one per connection), merged with
/// file-adjacent ones into one GET up to `max_read`: every GET costs a round
/// trip. Makes no request when constructed (unless the catalog has not yet
/// seen an object: then it HEADs it, through the catalog).
class s3_reader {
 public:
  /// Slices below this size are staged and merged (see above).
  static constexpr std::uint64_t staged_below = std::uint64_t{1} << 20;

  s3_reader(const checkpoint& ck, s3_catalog& cat, std::size_t connections, const load_options& opt)
      : opt_(opt),
        pool_(detail::reader_staging(opt, connections)),
        src_(ioc_.get_executor(), with_connections(cat.cfg(), connections), ck.shard_uris()) {
    for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src_.pin(i, cat.object_info(ck.shards()[i].name));
    opt_.queue_depth = std::max<unsigned>(opt_.queue_depth, 2 * static_cast<unsigned>(src_.client().cfg().max_connections));
    // A stop cancels GETs in flight too (as in the blocking load, src/s3/load.cpp).
    if (opt.stop.stop_possible()) on_stop_.emplace(opt.stop, cancel_gets{&src_});
  }

  /// Reads the batch (see slice_reader).
  void read(planned_reads& reads) { detail::read_slices(ioc_, src_, pool_, opt_, reads, staged_below); }
  [[nodiscard]] const io_counters& counters() const noexcept { return src_.counters(); }
  /// Connections of this reader's client (its pool size).
  [[nodiscard]] std::size_t connections() const noexcept { return connections_; }
  /// GETs in flight at most (2 x connections, or load_options::queue_depth if larger).
  [[nodiscard]] unsigned queue_depth() const noexcept { return opt_.queue_depth; }

 private:
  static s3::config with_connections(s3::config cfg, std::size_t n) {
    cfg.max_connections = std::max<std::size_t>(1, n);
    return cfg;
  }

  struct cancel_gets {
    s3_source* src;
    void operator()() const { src->cancel(); }
  };

  load_options opt_;
  asio::io_context ioc_{1};   // before the client that runs on it: destroyed after it
  staging_pool pool_;
  s3_source src_;
  std::size_t connections_ = src_.client().cfg().max_connections;
  std::optional<std::stop_callback<cancel_gets>> on_stop_;   // last: gone before src_
};

static_assert(slice_reader<s3_reader>);

}  // namespace sluice::inline v0
