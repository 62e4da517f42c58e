#pragma once
/// \file
/// Blocking load of a checkpoint stored in S3 (link sluice::s3): the catalog
/// opened it (index + headers, ETags pinned); the data path is an s3_source
/// over the same pinned versions, with as many range GETs in flight as the
/// connection pool allows. Compiled once in the s3 component, over any_sink
/// (src/s3/load.cpp), like the local load.

#include <utility>

#include <sluice/checkpoint.hpp>
#include <sluice/core/staging_pool.hpp>
#include <sluice/load.hpp>
#include <sluice/load_file.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/source/s3_source.hpp>

namespace sluice::inline v0 {

extern template task<load_stats> load_async<s3_source, any_sink>(const checkpoint&, s3_source&, any_sink&, staging_pool&,
                                                                 load_options);

/// Loads `ck` (opened through `cat`) into `s`, staging through `pool` (reuse
/// a pool across loads: its pages are faulted in once). Every object is read
/// at the version (ETag) the catalog saw, so an object replaced mid-load fails
/// with s3_object_changed_error. The queue depth is raised to twice the
/// client's connection count: fetch releases results in order, so with depth
/// == connections an early-finishing GET would leave its connection idle until
/// the oldest one completes, and requests would go out in waves (see
/// bench/README.md, bench-s3). A stop (`opt.stop`) also cancels the GETs in
/// flight.
load_stats load(const checkpoint& ck, s3_catalog& cat, any_sink s, staging_pool& pool, load_options opt = {});

template <sink Sink>
  requires(!std::same_as<Sink, any_sink>)
load_stats load(const checkpoint& ck, s3_catalog& cat, Sink& s, staging_pool& pool, load_options opt = {}) {
  return load(ck, cat, any_sink(s), pool, std::move(opt));
}

/// As above, with a staging pool made for this load.
load_stats load(const checkpoint& ck, s3_catalog& cat, any_sink s, load_options opt = {});

template <sink Sink>
  requires(!std::same_as<Sink, any_sink>)
load_stats load(const checkpoint& ck, s3_catalog& cat, Sink& s, load_options opt = {}) {
  return load(ck, cat, any_sink(s), std::move(opt));
}

}  // namespace sluice::inline v0
