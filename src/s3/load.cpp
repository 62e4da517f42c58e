// The blocking S3 load, compiled once over any_sink (see s3_load.hpp).

#include <sluice/source/s3_load.hpp>

#include <algorithm>
#include <stop_token>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/core/run.hpp>

namespace sluice::inline v0 {

template task<load_stats> load_async<s3_source, any_sink>(const checkpoint&, s3_source&, any_sink&, staging_pool&,
                                                          load_options);

load_stats load(const checkpoint& ck, s3_catalog& cat, any_sink s, staging_pool& pool, load_options opt) {
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
  const unsigned threads = opt.threads;
  return run_blocking(ioc, load_async(ck, src, s, pool, std::move(opt)), threads);
}

load_stats load(const checkpoint& ck, s3_catalog& cat, any_sink s, load_options opt) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, cat, s, pool, std::move(opt));
}

}  // namespace sluice::inline v0
