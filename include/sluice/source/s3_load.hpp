#pragma once
/// \file
/// Blocking load of a checkpoint stored in S3 (link sluice::s3): the catalog
/// opened it (index + headers, ETags pinned); the data path is an s3_source
/// over the same pinned versions, with as many range GETs in flight as the
/// connection pool allows.

#include <utility>

#include <algorithm>
#include <stop_token>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/load.hpp>
#include <sluice/load_file.hpp>
#include <sluice/source/s3_source.hpp>

namespace sluice::inline v0 {

/// Loads `ck` (opened through `cat`) into `s`, staging through `pool` (reuse
/// a pool across loads: its pages are faulted in once). Every object is read
/// at the version (ETag) the catalog saw, so an object replaced mid-load fails
/// with s3_object_changed_error. The queue depth is raised to twice the
/// client's connection count: fetch releases results in order, so with depth
/// == connections an early-finishing GET would leave its connection idle until
/// the oldest one completes, and requests would go out in waves (see
/// bench/README.md, bench-s3).
template <sink Sink>
load_stats load(const checkpoint& ck, s3_catalog& cat, Sink& s, staging_pool& pool, load_options opt = {}) {
  asio::io_context ioc{static_cast<int>(std::max(1u, opt.threads))};
  std::vector<std::string> uris;
  for (const auto& sh : ck.shards()) uris.push_back(sh.uri);
  s3_source src(ioc.get_executor(), cat.cfg(), std::move(uris));
  for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src.pin(i, cat.object_info(ck.shards()[i].name));
  opt.queue_depth = std::max<unsigned>(opt.queue_depth, 2 * static_cast<unsigned>(cat.cfg().max_connections));
  // A stop aborts the pipeline's channels; GETs in flight would still wait for
  // their bytes (a stalled one up to the low-speed window, times its retries):
  // cancel them too.
  std::stop_callback cancel_gets(opt.stop, [&src] { src.cancel(); });
  return run_on(ioc, load_async(ck, src, s, pool, opt), opt.threads);
}

/// As above, with a staging pool made for this load.
template <sink Sink>
load_stats load(const checkpoint& ck, s3_catalog& cat, Sink& s, load_options opt = {}) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, cat, s, pool, opt);
}

}  // namespace sluice::inline v0
