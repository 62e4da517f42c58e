// The blocking local load, compiled once over any_sink (see load_file.hpp).

#include <sluice/load_file.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

namespace sluice::inline v0 {

template task<load_stats> load_async<file_source, any_sink>(const checkpoint&, file_source&, any_sink&, staging_pool&,
                                                            load_options);

load_stats load(const checkpoint& ck, any_sink s, staging_pool& pool, load_options opt) {
  asio::io_context ioc{static_cast<int>(std::max(1u, opt.threads))};
  uring_context ring(ioc, {opt.ring_entries, opt.register_buffers});
  if (opt.register_buffers) ring.register_buffers(pool.region(), pool.slot_size());
  std::vector<std::string> paths;
  for (const auto& sh : ck.shards()) paths.push_back(sh.uri);
  file_source src(ring, std::move(paths), opt.io, opt.punt_buffered);
  const unsigned threads = opt.threads;
  return run_blocking(ioc, load_async(ck, src, s, pool, std::move(opt)), threads);
}

load_stats load(const checkpoint& ck, any_sink s, load_options opt) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, s, pool, std::move(opt));
}

}  // namespace sluice::inline v0
