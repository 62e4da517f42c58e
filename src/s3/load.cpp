// The data paths of an S3 checkpoint (s3_catalog): the blocking load,
// compiled once over any_sink, and the distributed load's reader.

#include <sluice/s3/distributed.hpp>
#include <sluice/s3/load.hpp>

#include <algorithm>
#include <stop_token>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/core/run.hpp>

namespace sluice::inline v0 {

template task<load_stats> load_async<s3_source, any_sink>(const checkpoint&, s3_source&, any_sink&, staging_pool&,
                                                          load_options);

load_stats s3_catalog::load(const checkpoint& ck, any_sink s, staging_pool& pool, const load_options& options) {
  auto opt = options;
  asio::io_context ioc{static_cast<int>(std::max(1u, opt.threads))};
  s3_source src(ioc.get_executor(), cfg(), ck.shard_uris());
  for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src.pin(i, object_info(ck.shards()[i].name));
  opt.queue_depth = std::max<unsigned>(opt.queue_depth, 2 * static_cast<unsigned>(cfg().max_connections));
  // A stop aborts the pipeline's channels; GETs in flight would still wait for
  // their bytes (a stalled one up to the low-speed window, times its retries):
  // cancel them too.
  std::stop_callback cancel_gets(opt.stop, [&src] { src.cancel(); });
  const unsigned threads = opt.threads;
  return run_blocking(ioc, load_async(ck, src, s, pool, std::move(opt)), threads);
}

std::unique_ptr<any_slice_reader> s3_catalog::slice_reader(const checkpoint& ck, const load_options& opt,
                                                           const reader_sizing& sizing) {
  const auto n = rank_connections(cfg().max_connections, sizing);
  return any_slice_reader::wrap(std::make_unique<s3_reader>(ck, *this, n, opt));
}

}  // namespace sluice::inline v0
