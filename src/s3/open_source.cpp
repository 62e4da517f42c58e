// The data path of an S3 checkpoint (s3_catalog): an s3_source with a client
// of its own, pinned to the versions the catalog saw (the one place an S3
// source is set up; the loads over it are in the core).

#include <sluice/s3/source.hpp>

#include <algorithm>
#include <memory>

#include <boost/asio/io_context.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/load.hpp>
#include <sluice/s3/distributed.hpp>
#include <sluice/source/any_source.hpp>

namespace sluice::inline v0 {

std::unique_ptr<any_source> s3_catalog::open_source(const checkpoint& ck, asio::io_context& ioc, const source_options& opt,
                                                    const reader_sizing& sizing) {
  auto c = cfg();
  c.max_connections = rank_connections(c.max_connections, sizing);
  auto src = std::make_unique<s3_source>(ioc.get_executor(), std::move(c), ck.shard_uris());
  for (std::uint32_t i = 0; i < ck.shards().size(); ++i) src->pin(i, object_info(ck.shards()[i].name));
  src->use_cache(cache(), ioc);
  const auto depth = std::max<unsigned>(opt.queue_depth, 2 * static_cast<unsigned>(src->connections()));
  return any_source::wrap(std::move(src), depth, staged_below);
}

}  // namespace sluice::inline v0
