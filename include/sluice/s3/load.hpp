#pragma once
/// \file
/// Blocking load of a checkpoint stored in S3 (link sluice::s3): call
/// `load(ck, sink, ...)` (load_file.hpp) on a checkpoint opened through an
/// s3_catalog (or an "s3://" location). The catalog opened it (index +
/// headers, ETags pinned); its data path (s3_catalog::load, compiled once in
/// the s3 component over any_sink) is an s3_source over the same pinned
/// versions, with up to twice as many range GETs in flight as the client has
/// connections: fetch releases results in order, so with depth ==
/// connections an early-finishing GET would leave its connection idle until
/// the oldest one completes (see bench/README.md, bench-s3).

#include <utility>

#include <sluice/checkpoint.hpp>
#include <sluice/core/staging_pool.hpp>
#include <sluice/load.hpp>
#include <sluice/load_file.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/s3/source.hpp>

namespace sluice::inline v0 {

extern template task<load_stats> load_async<s3_source, any_sink>(const checkpoint&, s3_source&, any_sink&, staging_pool&,
                                                                 load_options);

}  // namespace sluice::inline v0
