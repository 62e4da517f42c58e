// The data paths of a local checkpoint: io_uring reads through file_source.

#include <sluice/source/directory_catalog.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/core/run.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/distributed/file_reader.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/source/file_source.hpp>

namespace sluice::inline v0 {

template task<load_stats> load_async<file_source, any_sink>(const checkpoint&, file_source&, any_sink&, staging_pool&,
                                                            load_options);

load_stats directory_catalog::load(const checkpoint& ck, any_sink s, staging_pool& pool, const load_options& opt) {
  asio::io_context ioc{static_cast<int>(std::max(1u, opt.threads))};
  uring_context ring(ioc, {opt.ring_entries, opt.register_buffers});
  if (opt.register_buffers) ring.register_buffers(pool.region(), pool.slot_size());
  file_source src(ring, ck.shard_uris(), opt.io, opt.punt_buffered);
  return run_blocking(ioc, load_async(ck, src, s, pool, opt), opt.threads);
}

std::unique_ptr<any_slice_reader> directory_catalog::slice_reader(const checkpoint& ck, const load_options& opt,
                                                                  const reader_sizing& sizing) {
  // A reader with more than its rank's share of the node (fewer readers than
  // ranks) keeps more reads in flight; its ring must hold them.
  auto o = opt;
  o.queue_depth = sizing.queue_depth(opt.queue_depth);
  o.ring_entries = std::max(o.ring_entries, o.queue_depth);
  return any_slice_reader::wrap(std::make_unique<file_reader>(ck, o));
}

}  // namespace sluice::inline v0
