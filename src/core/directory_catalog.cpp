// The data path of a local checkpoint: a file_source over an io_uring of its
// own (the one place a directory's source is set up).

#include <sluice/source/directory_catalog.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/load.hpp>
#include <sluice/source/any_source.hpp>
#include <sluice/source/file_source.hpp>

namespace sluice::inline v0 {

namespace {
// A file_source with the ring it reads through (the ring before the source:
// the source goes first).
class ring_file_source {
 public:
  ring_file_source(asio::io_context& ioc, const checkpoint& ck, const source_options& opt, unsigned depth, bool populate,
                   bool map_uncached)
      : ring_(ioc, uring_options{std::max(opt.ring_entries, depth), opt.register_buffers}),
        src_(ring_, ck.shard_uris(), opt.io, opt.punt_buffered, populate) {
    src_.map_uncached(map_uncached);
  }
  [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    return src_.read_at(file, offset, dst);
  }
  [[nodiscard]] task<std::size_t> read_via_page_cache(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    return src_.read_via_page_cache(file, offset, dst);
  }
  [[nodiscard]] std::size_t file_count() const noexcept { return src_.file_count(); }
  [[nodiscard]] std::string file_uri(std::uint32_t file) const { return src_.file_uri(file); }
  [[nodiscard]] const io_counters& counters() const noexcept { return src_.counters(); }
  [[nodiscard]] std::uint32_t direct_alignment(std::uint32_t file) const { return src_.direct_alignment(file); }
  [[nodiscard]] std::uint32_t direct_alignment_at(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    return src_.direct_alignment_at(file, offset, length);
  }
  [[nodiscard]] bool can_map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    return src_.can_map(file, offset, length);
  }
  [[nodiscard]] task<lease> map(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    return src_.map(file, offset, length);
  }
  [[nodiscard]] bool cached(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const {
    return src_.cached(file, offset, length);
  }
  [[nodiscard]] lease view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) { return src_.view(file, offset, length); }
  [[nodiscard]] lease transient_view(std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
    return src_.transient_view(file, offset, length);
  }
  void cancel() { ring_.cancel_all(); }
  void register_buffers(staging_pool& pool) { ring_.register_buffers(pool.region(), pool.slot_size()); }

 private:
  uring_context ring_;
  file_source src_;
};
}  // namespace

std::unique_ptr<any_source> directory_catalog::open_source(const checkpoint& ck, asio::io_context& ioc,
                                                           const source_options& opt, const reader_sizing& sizing) {
  // A reader with more than its rank's share of the node (fewer readers than
  // ranks) keeps more reads in flight; its ring must hold them.
  const unsigned depth = sizing.queue_depth(opt.queue_depth);
  // Ranks that take from the page cache what this one reads: the reads of
  // such bytes go through it (byte_extent::via_page_cache; past it, each
  // byte would come from disk twice), and a view of a range not cached is
  // its read (the node's cooperative fill). Other reads still bypass it
  // where io=automatic would: the bytes only this rank keeps, and the
  // tables it reads into the node's segment.
  return any_source::wrap(std::make_unique<ring_file_source>(ioc, ck, opt, depth, opt.populates(sizing.local_ranks),
                                                             sizing.page_cache),
                          depth);
}

}  // namespace sluice::inline v0
