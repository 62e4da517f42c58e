// The blocking load of any checkpoint, through the catalog it was opened by
// (see load_file.hpp): io_uring for a directory, range GETs for S3.

#include <sluice/load_file.hpp>

#include <nlohmann/json.hpp>

#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

nlohmann::ordered_json load_stats::to_json() const {
  const double gib = static_cast<double>(tensor_bytes) / double(1ull << 30);
  return {{"tensors", tensors},
          {"tensor_bytes", tensor_bytes},
          {"bytes_read", bytes_read},
          {"storage_bytes", storage_bytes},
          {"header_bytes_read", header_bytes_read},
          {"files_opened", files_opened},
          {"requests", requests},
          {"seconds", seconds},
          {"gib_per_s", seconds > 0 ? gib / seconds : 0},
          {"staging", {{"slot_size", slot_size}, {"slots", slots}, {"slots_used", slots_used}}},
          {"stages", {{"fetch", {{"requests", fetch.items}, {"bytes", fetch.bytes}, {"busy_seconds", fetch.busy_seconds}}},
                      {"place", {{"views", place.items}, {"bytes", place.bytes}, {"busy_seconds", place.busy_seconds}}}}}};
}

load_stats load(const checkpoint& ck, any_sink s, staging_pool& pool, load_options opt) {
  return ck.storage().load(ck, s, pool, opt);
}

load_stats load(const checkpoint& ck, any_sink s, load_options opt) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, s, pool, std::move(opt));
}

}  // namespace sluice::inline v0
