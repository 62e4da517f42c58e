// The blocking load of any checkpoint, written once over the source its
// catalog opens (see load_file.hpp): io_uring for a directory, range GETs for S3.

#include <sluice/load_file.hpp>

#include <algorithm>
#include <optional>
#include <stop_token>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <sluice/core/run.hpp>
#include <sluice/source/any_source.hpp>
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
          {"mapped", {{"tensors", mapped_tensors}, {"bytes", mapped_bytes}}},
          {"prefaulted_bytes", prefaulted_bytes},
          {"cache", {{"hit_bytes", cache_hit_bytes}, {"fetched_bytes", cache_fetched_bytes},
                     {"refetched_bytes", cache_refetched_bytes}}},
          {"stages", {{"fetch", {{"requests", fetch.items}, {"bytes", fetch.bytes}, {"busy_seconds", fetch.busy_seconds}}},
                      {"place", {{"views", place.items}, {"bytes", place.bytes}, {"busy_seconds", place.busy_seconds}}}}}};
}

template task<load_stats> load_async<any_source, any_sink>(const checkpoint&, any_source&, any_sink&, staging_pool&,
                                                           load_options);

namespace {
struct cancel_source {
  any_source* src;
  void operator()() const { src->cancel(); }
};
}  // namespace

load_stats load(const checkpoint& ck, any_sink s, staging_pool& pool, load_options opt) {
  const unsigned threads = std::max(1u, opt.threads);
  asio::io_context ioc{static_cast<int>(threads)};
  const auto src = ck.storage().open_source(ck, ioc, opt.source());
  if (opt.register_buffers) src->register_buffers(pool);
  opt.queue_depth = src->queue_depth();
  // A stop aborts the pipeline's channels; reads in flight would still wait
  // for their bytes (a stalled GET up to the low-speed window, times its
  // retries): cancel them too.
  std::optional<std::stop_callback<cancel_source>> on_stop;
  if (opt.stop.stop_possible()) on_stop.emplace(opt.stop, cancel_source{src.get()});
  return run_blocking(ioc, load_async(ck, *src, s, pool, std::move(opt)), threads);
}

load_stats load(const checkpoint& ck, any_sink s, load_options opt) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, s, pool, std::move(opt));
}

}  // namespace sluice::inline v0
