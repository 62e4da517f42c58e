#pragma once
/// \file
/// The node-local cache of remote checkpoints: a directory of fixed-size,
/// aligned blocks of each object version, each block one file that carries the
/// XXH3 hash computed as it was fetched. A load reads through it
/// (cache/read_through.hpp): blocks it has are read from local disk and
/// verified, the others fetched once and written as they pass.
///
/// Layout, under the directory (0700, this user's):
///
///     v1/<object>/<version>/identity     what the version is (endpoint, bucket, key, ETag, size, block size)
///     v1/<object>/<version>/lock         the blocks' locks (one byte each, OFD locks)
///     v1/<object>/<version>/<N>.blk      block N: its bytes, then a 64-byte trailer
///     v1/<object>/<version>/tmp.<N>.*    a block being written (never served)
///
/// `<object>` is the XXH3-128 of endpoint, bucket and key; `<version>` that of
/// the whole identity. Never a model name or a topology: any later load's
/// slices reuse the blocks they span. A version other than the one a load
/// pinned is removed when that load opens the object (unless in use).
///
/// Sharing and crashes: one writer per block (an exclusive lock on its byte),
/// readers hold a shared one while they read; a block is written to a
/// temporary file, fsynced, renamed; a writer killed mid-block leaves a
/// temporary file that no reader opens and the next writer of the block
/// removes. Eviction (least recently served first) takes the block's
/// exclusive lock without waiting, so a block being read is never evicted.
///
/// Trust: hashes detect corruption, not tampering. The directory must be
/// this user's with no group or other bits, and every file this user's with
/// mode 0600, or the cache refuses it (config_error naming it).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <boost/asio/thread_pool.hpp>

#include <sluice/cache/options.hpp>
#include <sluice/error.hpp>

namespace sluice::inline v0::cache {

/// What an object version is: its bytes are what `endpoint` served for
/// bucket/key with this ETag (or version id) and size.
struct object_id {
  std::string endpoint, bucket, key, etag;
  std::uint64_t size = 0;
};

/// What one process's cache did (all its loads).
struct counters {
  std::atomic<std::uint64_t> hit_bytes{0};        ///< bytes served from verified blocks
  std::atomic<std::uint64_t> fetched_bytes{0};    ///< bytes of blocks fetched from the remote (written or not)
  std::atomic<std::uint64_t> refetched_bytes{0};  ///< of those, blocks fetched again because the cached one was bad
  std::atomic<std::uint64_t> bad_blocks{0};       ///< cached blocks that failed verification (discarded)
  std::atomic<std::uint64_t> written_blocks{0};
  std::atomic<std::uint64_t> unwritten_blocks{0}; ///< fetched but not cached (cap full of blocks in use, disk error)
  std::atomic<std::uint64_t> evicted_blocks{0};
  std::atomic<std::uint64_t> hashed_bytes{0};     ///< bytes hashed (verified or written)
  std::atomic<std::uint64_t> hash_ns{0};          ///< time spent hashing them (one thread each)
};

/// A held lock on one block (closes its own open file description).
class block_lock {
 public:
  block_lock() = default;
  explicit block_lock(int fd) noexcept : fd_(fd) {}
  block_lock(block_lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  block_lock& operator=(block_lock&& o) noexcept;
  ~block_lock();
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class block_cache;

/// The trailer of a block file.
struct block_trailer {
  static constexpr std::size_t size = 64;
  std::uint64_t index = 0, length = 0, block_size = 0, identity = 0, hash = 0;
};

/// An open block file: its descriptor(s) and what its size says.
struct block_file {
  int fd = -1;          ///< buffered
  int direct_fd = -1;   ///< O_DIRECT, when the block is cold and the read may use it
  block_file() = default;
  block_file(block_file&& o) noexcept : fd(std::exchange(o.fd, -1)), direct_fd(std::exchange(o.direct_fd, -1)) {}
  block_file& operator=(block_file&&) = delete;
  ~block_file();
};

/// One object version in the cache. Thread-safe; every call is synchronous
/// (read_through runs them where they may block).
class entry {
 public:
  entry(block_cache& owner, object_id id, std::string dir, std::uint64_t identity_hash);

  [[nodiscard]] const object_id& id() const noexcept { return id_; }
  [[nodiscard]] std::uint64_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::uint64_t block_count() const noexcept { return (id_.size + block_size_ - 1) / block_size_; }
  [[nodiscard]] std::uint64_t block_length(std::uint64_t b) const noexcept {
    return std::min(block_size_, id_.size - b * block_size_);
  }
  [[nodiscard]] std::string block_path(std::uint64_t b) const;
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

  /// The block's lock, shared or exclusive, if no one holds it the other way.
  [[nodiscard]] block_lock try_lock(std::uint64_t b, bool exclusive) const;
  /// The block's file, or nothing when there is none. A file of the wrong
  /// size is there but bad: `why` says so and nothing is returned. A file
  /// not this user's or with group/other bits: config_error. With
  /// `direct_if_cold`, an O_DIRECT descriptor too when most of the block is
  /// not in the page cache (cachestat, as the file source decides).
  [[nodiscard]] std::optional<block_file> open_block(std::uint64_t b, bool direct_if_cold, std::string& why) const;
  /// Whether `data` with `trailer` (the 64 bytes after it) is block `b` as
  /// fetched; `why` says what is wrong. Hashes `data` (counted).
  [[nodiscard]] bool verify(std::uint64_t b, std::span<const std::byte> data, std::span<const std::byte> trailer,
                            std::string& why) const;
  /// Marks the block served (its modification time: the eviction order).
  void touch(const block_file& f) const noexcept;
  /// Hashes a fetched block (counted).
  [[nodiscard]] std::uint64_t hash(std::span<const std::byte> data) const;
  /// Under the block's exclusive lock: writes `data` (hashed `h`) as block
  /// `b`: temporary file, fsync, rename. False (reported) when it could not
  /// be written, e.g. the cap is full of blocks in use or the disk is.
  bool publish(std::uint64_t b, std::span<const std::byte> data, std::uint64_t h);
  /// Under the block's exclusive lock: removes the block's file and any
  /// temporary file a dead writer left.
  void discard(std::uint64_t b) const;

 private:
  block_cache* owner_;
  object_id id_;
  std::string dir_;
  std::uint64_t identity_hash_;
  std::uint64_t block_size_;
};

/// A cache directory as one process uses it: the entries it opened, its
/// counters, its writer threads. Share one among the process's loads.
class block_cache {
 public:
  /// Creates the directory (0700) if missing; refuses one that is not this
  /// user's or has group/other bits (config_error naming it and the fix).
  /// `shared_counters`: counters to add to (shared() keeps one set per
  /// directory for the process's life); its own when null.
  explicit block_cache(options opt, std::shared_ptr<counters> shared_counters = nullptr);
  ~block_cache();
  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;

  /// The process's cache for `opt.dir` (one per directory; options of the
  /// first caller). Null for an empty dir.
  [[nodiscard]] static std::shared_ptr<block_cache> shared(const options& opt);
  /// The directory shared() handed out last and its counters, cumulative
  /// over the process's caches of that directory (null before any): what
  /// tools report after a load, when its cache may be gone.
  struct usage {
    std::string dir;
    std::shared_ptr<const counters> stats;
  };
  [[nodiscard]] static std::optional<usage> last_used();

  /// The entry of `id`, made if new; other versions of the same object are
  /// removed (but not a block someone holds). Null when `id` has no ETag:
  /// such an object cannot be pinned to a version, so it is never cached.
  [[nodiscard]] std::shared_ptr<entry> open(const object_id& id);

  [[nodiscard]] const options& opts() const noexcept { return opt_; }
  [[nodiscard]] counters& stats() noexcept { return *counters_; }
  [[nodiscard]] const counters& stats() const noexcept { return *counters_; }
  /// Threads that hash, verify and write blocks (off the reading thread).
  [[nodiscard]] boost::asio::thread_pool& workers() noexcept { return workers_; }
  /// Bytes of block files in the directory as of the last scan plus what
  /// this process wrote since.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_.load(); }

  /// Makes room for `incoming` bytes under the cap: removes the least
  /// recently served blocks no one holds. False when that is not enough.
  bool make_room(std::uint64_t incoming);
  /// Removes every block no one holds until the blocks take at most
  /// `target` bytes (eviction; also `sluice-cache`-style trimming in tests).
  void trim(std::uint64_t target);
  /// A block write of `n` bytes (reserved by make_room) ended: written or not.
  void written(std::uint64_t n, bool ok) noexcept;
  /// The worker threads that hash and write blocks, so as many block writes
  /// as this can be under way at once. Hashing is CPU (two cores' worth
  /// here), writing and fsync mostly wait on the disk: four threads keep
  /// several block writes in the disk's queue.
  static constexpr unsigned worker_threads = 4;
  /// The ordinal of the next block write (the test fault point `cache-write:N`).
  [[nodiscard]] std::uint64_t next_write() noexcept { return writes_begun_++; }
  void report(const std::string& what) const;

 private:
  std::uint64_t scan() const;
  void trim_locked(std::uint64_t target);   // trim, evict_mutex_ held
  options opt_;
  std::shared_ptr<counters> counters_;
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> writes_begun_{0};
  std::atomic<std::uint64_t> in_flight_{0};   // bytes reserved by writes not yet ended
  std::atomic<std::uint64_t> ended_{0};       // bytes of writes ended so far (written or not)
  std::mutex evict_mutex_;
  boost::asio::thread_pool workers_{worker_threads};
};

}  // namespace sluice::inline v0::cache
