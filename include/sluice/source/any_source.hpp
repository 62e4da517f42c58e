#pragma once
/// \file
/// `any_source`: the data path of a checkpoint behind a virtual interface, as
/// a catalog opens it (`catalog::open_source`). The loads are written once,
/// over it: the blocking load (load_file.hpp, through load_async) and the
/// distributed load's slice reader (distributed/slice_reader.hpp). A backend
/// (a directory over io_uring, S3) sets up its source in one place, its
/// catalog's open_source, and knows none of the loads (as an Asio stream
/// knows none of the algorithms over it).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <sluice/memory/lease.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

class staging_pool;

/// A source (models `sluice::source`) whose type is erased, with what the
/// loads ask of the backend beside its reads:
/// - `queue_depth()`: reads (or GETs) in flight it wants, for the options and
///   the share of the node it was opened with (see catalog::open_source);
/// - `stage_below()`: extents smaller than this are better read through a
///   staging slot, merged with file-adjacent ones into one request (S3: a
///   request costs a round trip; local files: 0, every extent is read
///   straight into its destination);
/// - `connections()`: connections of its client (S3), 0 where there are none;
/// - `cancel()`: ends every read in flight and to come with cancelled_error
///   (thread-safe: a stop callback calls it from any thread); each read still
///   completes exactly once;
/// - `direct_alignment(file)`: the alignment (memory, offset, length) under
///   which a read of `file` bypasses the page cache (O_DIRECT), 0 where none:
///   fetch widens staged reads to it;
/// - `direct_alignment_at(file, offset, length)`: that alignment where a
///   read of the range would bypass the page cache, 0 where it would go
///   through it (local files under io=automatic: the range mostly cached);
///   direct_alignment(file) for a backend without it;
/// - `register_buffers(pool)`: uses `pool`'s slots as the backend's fixed
///   buffers where it has them (io_uring), before the first read; a no-op for
///   a backend without them;
/// - `can_map(file, offset, length)` and `map(...)`: a view of the range in
///   the page cache instead of a read (local files whose range is cached:
///   file_source::map), for a load that asks for views of large extents
///   (load_options::map_above); false, and usage_error, for a backend
///   without them (S3);
/// - `cached(file, offset, length)`: whether every byte of the range is in
///   the node's page cache now (a read of it would copy and never touch the
///   disk); false for a backend without one;
/// - `view(file, offset, length)`: a view of the range of the file's
///   mapping whose pages are not mapped in beforehand (they come in as they
///   are touched): for memory a rank maps but reads sparsely, such as a
///   shared table; usage_error where can_map is false;
/// - `transient_view(file, offset, length)`: the same bytes in a mapping of
///   their own, unmapped on the thread that drops the lease (not the
///   process's unmapping thread): for bytes copied once, right away (a shared
///   table's slice written into the node's segment); view()'s where the
///   backend has no such mappings.
///
/// Its reads run on the executor it was opened on (catalog::open_source's
/// io_context): a load co_awaits them there, never blocking a thread of it.
class any_source {
 public:
  virtual ~any_source() = default;

  /// Reads up to dst.size() bytes at `offset` of file `file` (the
  /// checkpoint's shard index) into `dst`; returns the count (short reads are
  /// normal, 0 at or past the end). Throws io_error naming the file and range,
  /// cancelled_error after cancel().
  [[nodiscard]] virtual task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) = 0;
  /// read_at for bytes other ranks of the node will take from its page
  /// cache: through it, never past it (file_source::read_via_page_cache);
  /// read_at for a backend without a page cache.
  [[nodiscard]] virtual task<std::size_t> read_via_page_cache(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    return read_at(file, offset, dst);
  }
  [[nodiscard]] virtual std::size_t file_count() const = 0;
  [[nodiscard]] virtual std::string file_uri(std::uint32_t file) const = 0;
  [[nodiscard]] virtual const io_counters& counters() const noexcept = 0;
  virtual void cancel() = 0;
  [[nodiscard]] virtual unsigned queue_depth() const noexcept = 0;
  [[nodiscard]] virtual std::uint64_t stage_below() const noexcept { return 0; }
  [[nodiscard]] virtual std::size_t connections() const noexcept { return 0; }
  /// Read requests should not cross a multiple of this in a file (0: any
  /// request is as good): the node-local cache's block size, so that each
  /// cached block is read, verified and written by one request.
  [[nodiscard]] virtual std::uint64_t read_alignment() const noexcept { return 0; }
  [[nodiscard]] virtual std::uint32_t direct_alignment(std::uint32_t file) const {
    (void)file;
    return 0;
  }
  [[nodiscard]] virtual std::uint32_t direct_alignment_at(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    (void)offset, (void)length;
    return direct_alignment(file);
  }
  virtual void register_buffers(staging_pool& pool) { (void)pool; }
  [[nodiscard]] virtual bool can_map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    (void)file, (void)offset, (void)length;
    return false;
  }
  [[nodiscard]] virtual task<lease> map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    (void)file, (void)offset, (void)length;
    throw usage_error("this source has no page-cache views (can_map is false)");
  }
  [[nodiscard]] virtual bool cached(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    (void)file, (void)offset, (void)length;
    return false;
  }
  [[nodiscard]] virtual lease view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    (void)file, (void)offset, (void)length;
    throw usage_error("this source has no page-cache views (can_map is false)");
  }
  [[nodiscard]] virtual lease transient_view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    return view(file, offset, length);  // a source without mappings of their own: its views
  }

  /// Owns `s` (any `source`) behind this interface, with the given preferred
  /// depth and staging threshold. What `s` does not have is taken as absent:
  /// no cancel() (its reads end on their own), no connections(), no
  /// direct_alignment(), no register_buffers().
  template <source S>
  [[nodiscard]] static std::unique_ptr<any_source> wrap(std::unique_ptr<S> s, unsigned queue_depth,
                                                        std::uint64_t stage_below = 0);
};

static_assert(source<any_source>);

namespace detail {
// What any_source::wrap returns: forwards to the source it owns (read_at
// returns the source's own task: no coroutine frame of its own).
template <source S>
class source_holder final : public any_source {
 public:
  source_holder(std::unique_ptr<S> s, unsigned depth, std::uint64_t stage_below)
      : s_(std::move(s)), depth_(depth ? depth : 1), stage_below_(stage_below) {}
  [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) override {
    return s_->read_at(file, offset, dst);
  }
  [[nodiscard]] task<std::size_t> read_via_page_cache(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) override {
    if constexpr (requires(S& x) { x.read_via_page_cache(file, offset, dst); })
      return s_->read_via_page_cache(file, offset, dst);
    else
      return s_->read_at(file, offset, dst);
  }
  [[nodiscard]] std::size_t file_count() const override { return s_->file_count(); }
  [[nodiscard]] std::string file_uri(std::uint32_t file) const override { return s_->file_uri(file); }
  [[nodiscard]] const io_counters& counters() const noexcept override { return s_->counters(); }
  void cancel() override {
    if constexpr (requires(S& x) { x.cancel(); }) s_->cancel();
  }
  [[nodiscard]] unsigned queue_depth() const noexcept override { return depth_; }
  [[nodiscard]] std::uint64_t stage_below() const noexcept override { return stage_below_; }
  [[nodiscard]] std::size_t connections() const noexcept override {
    if constexpr (requires(const S& x) { x.connections(); })
      return s_->connections();
    else
      return 0;
  }
  [[nodiscard]] std::uint64_t read_alignment() const noexcept override {
    if constexpr (requires(const S& x) { x.read_alignment(); })
      return s_->read_alignment();
    else
      return 0;
  }
  [[nodiscard]] std::uint32_t direct_alignment(std::uint32_t file) const override {
    if constexpr (requires(const S& x) { x.direct_alignment(file); })
      return s_->direct_alignment(file);
    else
      return 0;
  }
  [[nodiscard]] std::uint32_t direct_alignment_at(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const override {
    if constexpr (requires(const S& x) { x.direct_alignment_at(file, offset, length); })
      return s_->direct_alignment_at(file, offset, length);
    else
      return direct_alignment(file);
  }
  void register_buffers(staging_pool& pool) override {
    if constexpr (requires(S& x) { x.register_buffers(pool); }) s_->register_buffers(pool);
  }
  [[nodiscard]] bool can_map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const override {
    if constexpr (requires(const S& x) { x.can_map(file, offset, length); })
      return s_->can_map(file, offset, length);
    else
      return false;
  }
  [[nodiscard]] task<lease> map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) override {
    if constexpr (requires(S& x) { x.map(file, offset, length); })
      return s_->map(file, offset, length);
    else
      return any_source::map(file, offset, length);
  }
  [[nodiscard]] bool cached(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const override {
    if constexpr (requires(const S& x) { x.cached(file, offset, length); })
      return s_->cached(file, offset, length);
    else
      return false;
  }
  [[nodiscard]] lease view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) override {
    if constexpr (requires(S& x) { x.view(file, offset, length); })
      return s_->view(file, offset, length);
    else
      return any_source::view(file, offset, length);
  }
  [[nodiscard]] lease transient_view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) override {
    if constexpr (requires(S& x) { x.transient_view(file, offset, length); })
      return s_->transient_view(file, offset, length);
    else
      return any_source::transient_view(file, offset, length);
  }

 private:
  std::unique_ptr<S> s_;
  unsigned depth_;
  std::uint64_t stage_below_;
};
}  // namespace detail

template <source S>
std::unique_ptr<any_source> any_source::wrap(std::unique_ptr<S> s, unsigned queue_depth, std::uint64_t stage_below) {
  return std::make_unique<detail::source_holder<S>>(std::move(s), queue_depth, stage_below);
}

}  // namespace sluice::inline v0
