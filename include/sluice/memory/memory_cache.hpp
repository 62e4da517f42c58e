#pragma once
/// \file
/// `memory_cache`: memory kept between loads for the next one to reuse.
///
/// Fresh anonymous pages cost a first touch on every load (0.4-1.4 GB/s on
/// the machines measured; bench/README.md), while a reused staging slot or
/// buffer costs nothing. An engine that reloads weights streams the same
/// checkpoint again and again, so a cache keeps, between loads, the last idle
/// staging pool and the buffers of tensors the caller has dropped, up to
/// `capacity()` bytes of buffers. tensor_stream draws its pool and its
/// tensors' own buffers from one (by default `memory_cache::process()`).
///
/// Thread-safe. A buffer's lease may be released on any thread; it returns to
/// the cache (or is freed) then. The cache's state outlives the cache object
/// while leases of its buffers live.

#include <cstddef>
#include <cstdint>
#include <memory>

#include <sluice/memory/lease.hpp>
#include <sluice/memory/staging_pool.hpp>

namespace sluice::inline v0 {

/// What a memory_cache keeps and how often it was reused.
struct memory_cache_stats {
  std::size_t idle_pool_bytes = 0;    ///< the idle staging pool's bytes (0: none kept)
  std::size_t idle_buffer_bytes = 0;  ///< bytes of idle buffers kept
  std::uint64_t reused_pools = 0;     ///< pools handed out again
  std::uint64_t reused_buffers = 0;   ///< buffers handed out again
};

class memory_cache {
 public:
  memory_cache();
  ~memory_cache();
  memory_cache(const memory_cache&) = delete;
  memory_cache& operator=(const memory_cache&) = delete;

  /// The process's cache (never destroyed: tensors may release their buffers
  /// while the process exits).
  [[nodiscard]] static memory_cache& process();

  /// A pool for `o`: the idle one when its slot size and count are what `o`
  /// makes and every slot is free, else a new one. Throws what
  /// staging_pool's constructor throws.
  [[nodiscard]] std::shared_ptr<staging_pool> pool(const staging_options& o);
  /// Keeps `p` as the idle pool (the one kept before goes). Call it when the
  /// load that used `p` has ended; `pool()` reuses it once its slots are free.
  void put_pool(std::shared_ptr<staging_pool> p);

  /// A buffer of `size` bytes (the lease's span), by the reuse rule of
  /// memory/recycler.hpp (an idle buffer that holds it, at most twice its
  /// size, else a new mapping of its own, unmapped when freed: no heap keeps
  /// it resident; 2 MiB-aligned and advised for transparent huge pages from
  /// 2 MiB up, else 4096-aligned). `*capacity`, where given, receives the
  /// bytes the buffer really holds (what it counts against a budget). When
  /// the last copy of the lease goes, the buffer returns to the idle ones if
  /// they then stay within capacity(), else it is freed. Throws
  /// resource_error (naming the size) when memory cannot be had.
  [[nodiscard]] lease buffer(std::size_t size, std::size_t* capacity = nullptr);
  /// The bytes of buffers kept idle at most: raised to `bytes` if below it.
  void reserve(std::size_t bytes);
  [[nodiscard]] std::size_t capacity() const;
  /// Frees idle buffers until at most `keep` bytes of them remain (largest
  /// first). Returns the bytes freed.
  std::size_t trim(std::size_t keep);
  /// Frees every idle buffer and the idle pool (tensors still held keep
  /// theirs; buffers they release later are freed, not kept, until
  /// reserve() is called again).
  void release();
  [[nodiscard]] memory_cache_stats stats() const;

 private:
  struct state;
  std::shared_ptr<state> state_;
};

}  // namespace sluice::inline v0
