#pragma once
/// \file
/// Blocking load of a local checkpoint: io_uring file source, its own
/// io_context and threads, the staging pool registered with the ring.

#include <utility>

#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <sluice/core/uring.hpp>
#include <sluice/load.hpp>
#include <sluice/source/file_source.hpp>

namespace sluice::inline v0 {

/// Runs `t` on `ioc` with `threads` threads (this one included) and returns
/// its result or rethrows its error once every handler has run.
template <class T>
T run_on(asio::io_context& ioc, task<T> t, unsigned threads) {
  std::exception_ptr failure;
  std::optional<T> result;
  asio::co_spawn(asio::make_strand(ioc), std::move(t), [&](std::exception_ptr e, T v) {
    failure = e;
    if (!e) result.emplace(std::move(v));
  });
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back([&ioc] { ioc.run(); });
  ioc.run();
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  return std::move(*result);
}

/// Loads a local checkpoint into `s`. Throws the load's error (io_error,
/// truncated_error, cancelled_error, ...) after every part has stopped: no
/// slot, buffer or file outlives the call.
template <sink Sink>
load_stats load(const checkpoint& ck, Sink& s, staging_pool& pool, load_options opt = {}) {
  asio::io_context ioc{static_cast<int>(std::max(1u, opt.threads))};
  uring_context ring(ioc, {opt.ring_entries, opt.register_buffers});
  if (opt.register_buffers) ring.register_buffers(pool.region(), pool.slot_size());
  std::vector<std::string> paths;
  for (const auto& sh : ck.shards()) paths.push_back(sh.uri);
  file_source src(ring, std::move(paths), opt.io, opt.punt_buffered);
  return run_on(ioc, load_async(ck, src, s, pool, opt), opt.threads);
}

/// As above with a staging pool made for this load (opt.staging_budget,
/// slots for opt.max_read). Reuse a pool across loads with the overload
/// above: its pages are then faulted in once.
template <sink Sink>
load_stats load(const checkpoint& ck, Sink& s, load_options opt = {}) {
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  return load(ck, s, pool, opt);
}

}  // namespace sluice::inline v0
