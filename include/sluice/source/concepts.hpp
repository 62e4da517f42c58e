#pragma once
/// \file
/// What a storage backend provides: metadata access to open a checkpoint
/// (`catalog`, synchronous, headers and the index only) and the data path
/// (`source`, asynchronous positional reads into caller memory), which the
/// catalog opens (`catalog::open_source`, an any_source: any_source.hpp).

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <sluice/core/cores.hpp>
#include <sluice/core/task.hpp>

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace sluice::inline v0 {

/// How a file source reads (see file_source).
enum class io_mode {
  automatic,  ///< O_DIRECT when aligned and supported, unless the range is mostly in the page cache; buffered otherwise
  direct,     ///< O_DIRECT whenever aligned (cached or not); opening without O_DIRECT support is an error
  buffered,   ///< always through the page cache
};

/// Whether a read of `length` bytes at file `offset` into `memory` meets
/// O_DIRECT's alignment `align` (memory, offset and length alike): the one
/// check a file source reads by (file_source) and a reader stages by
/// (slice_reader).
[[nodiscard]] inline bool direct_io_aligned(std::uint64_t align, std::uint64_t offset, std::uint64_t length,
                                            const void* memory) noexcept {
  return align && offset % align == 0 && length % align == 0 && reinterpret_cast<std::uintptr_t>(memory) % align == 0;
}

/// Whether a page-cache view whose every page is cached has its pages mapped
/// in before it is handed out (see load_options::populate_views).
enum class populate_mode : std::uint8_t {
  automatic,  ///< where each of the node's local ranks has two hardware threads (core/cores.hpp)
  on,         ///< always: the consumer's first touches fault nothing
  off,        ///< never: the consumer's first touches map the pages in
};

/// Counters every source and catalog keeps (monotonic, thread-safe).
struct io_counters {
  std::atomic<std::uint64_t> bytes_read{0};      ///< payload bytes delivered to callers
  std::atomic<std::uint64_t> requests{0};        ///< read operations / GETs issued
  std::atomic<std::uint64_t> retries{0};         ///< retried operations (S3)
  std::atomic<std::uint64_t> files_opened{0};    ///< files / objects opened or HEADed
  // The node-local cache (cache/read_through.hpp), for the reads of this source:
  std::atomic<std::uint64_t> cache_hit_bytes{0};       ///< bytes of blocks served from the cache
  std::atomic<std::uint64_t> cache_fetched_bytes{0};   ///< bytes of blocks fetched from the remote
  std::atomic<std::uint64_t> cache_refetched_bytes{0}; ///< of those, blocks fetched again (the cached one was bad)
};

class any_source;
class checkpoint;

/// What a catalog's data path takes from the load that opens it: options of
/// its own, not the loader's (`load_options::source()` makes them). Where the
/// bytes come from, and how (an S3 source's endpoint, credentials, pool and
/// cache), is the catalog's own configuration (s3::config).
struct source_options {
  unsigned queue_depth = 4;          ///< reads the load keeps in flight (a source may prefer more: S3)
  io_mode io = io_mode::automatic;   ///< local files: O_DIRECT when aligned, required, or never
  unsigned ring_entries = 64;        ///< local files: io_uring SQ entries
  bool register_buffers = false;     ///< local files: register the staging pool with the ring
  bool punt_buffered = true;         ///< local files: buffered reads on io-wq (several copies at once)
  /// local files: map a cached view's pages in before handing it out
  /// (automatic: with reader_sizing::local_ranks, see populates())
  populate_mode populate_views = populate_mode::automatic;

  /// Whether `populate_views` means mapping cached views in ahead with
  /// `local_ranks` ranks on this node: where each has two hardware threads.
  [[nodiscard]] bool populates(std::size_t local_ranks) const noexcept {
    if (populate_views != populate_mode::automatic) return populate_views == populate_mode::on;
    return cores_to_spare(local_ranks);
  }
};

/// How many ranks of a node share a distributed load's storage, and what one
/// rank may use of it (S3: connections of its client; local files: reads in
/// flight).
///
/// The node's I/O is `local_ranks` shares. While only `readers` of them read
/// (a phase in which fewer ranks read, e.g. the shared tables under
/// shared-single), each reader gets local_ranks / readers of them: S3
/// connections are the node's connections split among the readers, and a
/// file reader's queue depth is `queue_depth` x local_ranks / readers.
struct reader_sizing {
  std::size_t local_ranks = 1;           ///< ranks on this node
  std::size_t connections_per_rank = 0;  ///< S3: 0 = the node's max_connections / local_ranks (at least 1)
  std::size_t readers = 0;               ///< ranks of this node reading at once; 0 = local_ranks
  /// Other ranks of this node read from the page cache what this source
  /// reads (catalog::shares_page_cache, policy::schedule::page_cache): the
  /// bytes they take are read through it (any_source::read_via_page_cache),
  /// and a view may be of a range not cached (its mapping in is the read).
  bool page_cache = false;

  /// Ranks among which the node's I/O is split (at least 1).
  [[nodiscard]] constexpr std::size_t sharers() const noexcept {
    const auto r = readers ? std::min(readers, local_ranks) : local_ranks;
    return r ? r : 1;
  }
  /// A queue depth of `per_rank` reads in flight, scaled to this reader's
  /// share of the node (local_ranks / sharers(), at least `per_rank`).
  [[nodiscard]] constexpr unsigned queue_depth(unsigned per_rank) const noexcept {
    const auto q = static_cast<std::size_t>(per_rank) * std::max<std::size_t>(1, local_ranks) / sharers();
    return static_cast<unsigned>(std::max<std::size_t>(per_rank, q));
  }
};

/// A checkpoint location's storage (a directory, an S3 prefix): metadata
/// access to open a checkpoint (list files, read the index, read the
/// safetensors headers; names are plain file names relative to the
/// location), and the data path that reads it (`open_source`). A checkpoint
/// remembers the catalog it was opened through, so every load of it, local
/// or S3, single-process or distributed, opens its source in one place; the
/// loads themselves are written once, over that source (load_file.hpp,
/// distributed/slice_reader.hpp).
class catalog {
 public:
  virtual ~catalog() = default;
  /// Human-readable location, e.g. "/data/ckpt" or "s3://bucket/prefix/".
  [[nodiscard]] virtual std::string location() const = 0;
  /// The full path or URI of one file, for messages and for sources.
  [[nodiscard]] virtual std::string uri(const std::string& name) const = 0;
  /// File names directly in the location (no recursion), sorted.
  [[nodiscard]] virtual std::vector<std::string> list() = 0;
  [[nodiscard]] virtual bool exists(const std::string& name) = 0;
  /// Size in bytes; throws io_error if the file does not exist.
  [[nodiscard]] virtual std::uint64_t size(const std::string& name) = 0;
  /// The version tag of a file where the location has one (S3: the ETag,
  /// quotes included), else nullopt (the default: a directory has none).
  [[nodiscard]] virtual std::optional<std::string> etag(const std::string& name) {
    (void)name;
    return std::nullopt;
  }
  /// Reads up to `length` bytes at `offset`; returns fewer only at end of file.
  [[nodiscard]] virtual std::vector<std::byte> read(const std::string& name, std::uint64_t offset,
                                                    std::uint64_t length) = 0;
  /// Reads the first `length` bytes or the whole file if shorter. Backends with
  /// expensive round trips (S3) may read more than needed and keep it; the
  /// default is `read(name, 0, length)`.
  [[nodiscard]] virtual std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) {
    return read(name, 0, length);
  }
  /// Says that read_prefix will be asked for each of `names` next (an
  /// opener about to read every shard's header). A backend with expensive
  /// round trips (S3) fetches their prefixes now, several at once, instead
  /// of one round trip after another; a failure is kept and thrown by that
  /// name's read_prefix, so errors still come in the order they are asked
  /// for. The default does nothing.
  virtual void prefetch_prefixes(const std::vector<std::string>& names) { (void)names; }
  /// Says that the opener has read every header it needed: what read_prefix
  /// kept for later header reads (S3: up to 1 MiB per shard, 163 MiB for a
  /// DeepSeek V3) can go. A later read_prefix fetches again. The default does
  /// nothing.
  virtual void forget_prefixes() {}
  /// Takes what the rank that opened a checkpoint for every rank saw of the
  /// file `name` (checkpoint::open(location, communicator)): its size and
  /// version tag. A catalog whose data path pins versions (S3) pins these, so
  /// that its reads need no HEAD and fail if the object changed since it was
  /// opened; one that can check cheaply (a directory: one stat) throws
  /// format_error "stale-shard" when its own file's size differs. The
  /// default takes nothing.
  virtual void adopt(const std::string& name, std::uint64_t size, const std::optional<std::string>& etag) {
    (void)name, (void)size, (void)etag;
  }
  /// Whether what one process reads through open_source's sources another
  /// process of this node can read again from memory, the kernel's page
  /// cache (local files: yes; S3: no). A distributed load then lets ranks of
  /// one node read the bytes they keep themselves instead of receiving them
  /// (policy::schedule::page_cache).
  [[nodiscard]] virtual bool shares_page_cache() const { return false; }
  /// Opens the data path of `ck` (opened through this catalog): a source over
  /// its shards whose reads run on `ioc` (local files: io_uring, `opt.io`,
  /// `opt.punt_buffered`, `opt.ring_entries`; S3: range GETs at the versions
  /// this catalog pinned, through its cache). `sizing` is this rank's share of the node's I/O
  /// (the default: a process alone on its node): it sets the source's
  /// preferred queue depth and, for S3, its connections. Throws io_error when
  /// the storage cannot be read (io_uring unavailable, a file that cannot be
  /// opened).
  [[nodiscard]] virtual std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc,
                                                                const source_options& opt,
                                                                const reader_sizing& sizing = {}) = 0;
  /// Bytes this catalog has read so far (headers and index).
  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return counters_.bytes_read.load(); }
  [[nodiscard]] const io_counters& counters() const noexcept { return counters_; }

 protected:
  io_counters counters_;
};

/// The data path: positional reads from the files of one checkpoint, addressed
/// by file index (the checkpoint's shard index).
///
/// `read_at(file, offset, dst)` reads up to dst.size() bytes at `offset` into
/// `dst` and returns the count; a short count is normal (callers resume), 0
/// means end of file. I/O failures throw io_error naming the file and range.
template <class S>
concept source = requires(S& s, std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
  { s.read_at(file, offset, dst) } -> std::same_as<task<std::size_t>>;
  { s.file_count() } -> std::convertible_to<std::size_t>;
  { s.file_uri(file) } -> std::convertible_to<std::string>;
  { s.counters() } -> std::same_as<const io_counters&>;
};

}  // namespace sluice::inline v0
