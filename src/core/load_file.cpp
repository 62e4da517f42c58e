// The blocking load of any checkpoint, through the catalog it was opened by
// (see load_file.hpp): io_uring for a directory, range GETs for S3.

#include <sluice/load_file.hpp>

#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

load_stats load(const checkpoint& ck, any_sink s, staging_pool& pool, load_options opt) {
  return ck.storage().load(ck, s, pool, opt);
}

load_stats load(const checkpoint& ck, any_sink s, load_options opt) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, s, pool, std::move(opt));
}

}  // namespace sluice::inline v0
