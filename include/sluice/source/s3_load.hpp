#pragma once
/// \file
/// Blocking load of a checkpoint stored in S3 (link sluice::s3): the catalog
/// opened it (index + headers, ETags pinned); the data path is an s3_source
/// over the same pinned versions, with as many range GETs in flight as the
/// connection pool allows.

#include <utility>

#include <algorithm>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/load.hpp>
#include <sluice/load_file.hpp>
#include <sluice/source/s3_source.hpp>

namespace sluice::inline v0 {

/// Loads `ck` (opened through `cat`) into `s`. The queue depth is raised to
/// the client's connection count (S3 throughput needs many streams); every
/// object is read at the version (ETag) the catalog saw, so an object replaced
/// mid-load fails with s3_object_changed_error.
template <sink Sink>
load_stats load(const checkpoint& ck, s3_catalog& cat, Sink& s, load_options opt = {}) {
  asio::io_context ioc{static_cast<int>(std::max(1u, opt.threads))};
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  std::vector<std::string> uris;
  for (const auto& sh : ck.shards()) uris.push_back(sh.uri);
  s3_source src(ioc.get_executor(), cat.cfg(), std::move(uris));
  for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src.pin(i, cat.object_info(ck.shards()[i].name));
  opt.queue_depth = std::max<unsigned>(opt.queue_depth, static_cast<unsigned>(cat.cfg().max_connections));
  return run_on(ioc, load_async(ck, src, s, pool, opt), opt.threads);
}

}  // namespace sluice::inline v0
