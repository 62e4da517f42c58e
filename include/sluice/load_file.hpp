#pragma once
/// \file
/// The blocking load of a checkpoint, wherever it is: `load(ck, sink, ...)`
/// opens the data path of the catalog `ck` was opened by
/// (checkpoint::storage().open_source: io_uring for a local directory, range
/// GETs for S3 with sluice::s3) on an io_context and threads of its own, and
/// runs load_async over it.
///
/// `load(ck, sink, ...)` for any sink type is compiled once, in the library
/// (src/core/load_file.cpp), over `any_sink` and `any_source`: a translation
/// unit that calls it instantiates no coroutine pipeline. `load_async` over
/// them is instantiated there too (extern template below).

#include <utility>

#include <sluice/checkpoint.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/source/any_source.hpp>

namespace sluice::inline v0 {

extern template task<load_stats> load_async<any_source, any_sink>(const checkpoint&, any_source&, any_sink&,
                                                                  staging_pool&, load_options);

/// Loads `ck` into `s` through `pool`. Throws the load's error
/// (io_error, truncated_error, cancelled_error, ...) after every part has
/// stopped: no slot, buffer, file or connection outlives the call. For S3,
/// every object is read at the version (ETag) the catalog saw (a replaced
/// object fails with s3_object_changed_error) and a stop (`opt.stop`) also
/// cancels the GETs in flight. Compiled in the
/// library; the overloads below forward to it.
load_stats load(const checkpoint& ck, any_sink s, staging_pool& pool, load_options opt = {});

/// As above for a sink of any type (referred to through an any_sink).
template <sink Sink>
  requires(!std::same_as<Sink, any_sink>)
load_stats load(const checkpoint& ck, Sink& s, staging_pool& pool, load_options opt = {}) {
  return load(ck, any_sink(s), pool, std::move(opt));
}

/// As above with a staging pool made for this load (opt.staging_budget,
/// slots for opt.max_read). Reuse a pool across loads with the overloads
/// above: its pages are then faulted in once.
load_stats load(const checkpoint& ck, any_sink s, load_options opt = {});

template <sink Sink>
  requires(!std::same_as<Sink, any_sink>)
load_stats load(const checkpoint& ck, Sink& s, load_options opt = {}) {
  return load(ck, any_sink(s), std::move(opt));
}

}  // namespace sluice::inline v0
