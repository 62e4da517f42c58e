#pragma once
/// \file
/// The local-file data path of a distributed load: io_uring reads of the
/// planned slices.

#include <utility>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/core/staging_pool.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/load.hpp>
#include <sluice/source/file_source.hpp>

namespace sluice::inline v0 {

/// The local-file data path of a distributed load (the default): an io_uring
/// `file_source` over the checkpoint's shards (`opt.io`, `opt.punt_buffered`,
/// `opt.ring_entries`), on an io_context of its own that `read` runs on the
/// calling thread, and a two-slot staging pool (reads go straight to their
/// destinations). Throws io_error if io_uring is unavailable.
class file_reader {
 public:
  file_reader(const checkpoint& ck, const load_options& opt) : opt_(opt) {
    ioc_ = std::make_unique<asio::io_context>(1);
    pool_ = std::make_unique<staging_pool>(detail::reader_staging(opt));
    ring_ = std::make_unique<uring_context>(*ioc_, uring_options{opt.ring_entries, opt.register_buffers});
    if (opt.register_buffers) ring_->register_buffers(pool_->region(), pool_->slot_size());
    src_ = std::make_unique<file_source>(*ring_, ck.shard_uris(), opt.io, opt.punt_buffered);
  }

  /// Reads the batch (see slice_reader).
  void read(planned_reads& reads) { detail::read_slices(*ioc_, *src_, *pool_, opt_, reads); }
  [[nodiscard]] const io_counters& counters() const noexcept { return src_->counters(); }
  /// Reads in flight at most (load_options::queue_depth).
  [[nodiscard]] unsigned queue_depth() const noexcept { return opt_.queue_depth; }

 private:
  load_options opt_;
  // Destroyed in reverse: the source before its ring, the ring before the io_context.
  std::unique_ptr<asio::io_context> ioc_;
  std::unique_ptr<staging_pool> pool_;
  std::unique_ptr<uring_context> ring_;
  std::unique_ptr<file_source> src_;
};

static_assert(slice_reader<file_reader>);

}  // namespace sluice::inline v0
