#pragma once
/// \file
/// `memory::recycler`: the one rule by which sluice reuses buffers, whatever
/// memory they are (anonymous host pages, pinned host pages, device memory):
///
/// - a buffer is lent as a `lease`; it goes back to its recycler when the
///   last copy of that lease goes (on any thread), never before: memory a
///   consumer still holds (a sink's view) is never handed out again;
/// - back there it stays idle while the idle buffers stay within the
///   recycler's capacity (`reserve`), else it is freed at once;
/// - a request takes the smallest idle buffer that holds it and is at most
///   twice its rounded size (of those, the one that came back last), else
///   new memory.
///
/// Users: the tensor buffers and window buffers a load keeps between loads
/// (memory_cache.hpp, window_buffers.hpp) and a device lane's pinned host and
/// device buffers (nccl/lane.hpp, testing/emulated_device_lane.hpp). The
/// staging pool (staging_pool.hpp) is not a user: its fixed slots are the
/// load's backpressure, and a slot is waited for, never allocated.
///
/// `Memory` makes and frees buffers:
///   std::size_t capacity_for(std::size_t n) const;  // bytes a buffer for n really has (n > 0)
///   void* allocate(std::size_t capacity);           // throws if it cannot
///   void free(void* p, std::size_t capacity) noexcept;
/// It is called without the recycler's lock held, from whichever thread
/// makes a request or lets go of a buffer's last lease.
///
/// Thread-safe; the recycler's state outlives the recycler object while
/// leases of its buffers live.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <sluice/memory/lease.hpp>

namespace sluice::inline v0::memory {

struct recycler_stats {
  std::size_t idle_bytes = 0;      ///< bytes of idle buffers kept
  std::size_t live_bytes = 0;      ///< bytes of buffers allocated and not yet freed (lent or idle)
  std::uint64_t allocations = 0;   ///< buffers allocated (Memory::allocate)
  std::uint64_t reused = 0;        ///< requests served from an idle buffer
};

template <class Memory>
class recycler {
 public:
  explicit recycler(Memory m = {}) : state_(std::make_shared<state>(std::move(m))) {}
  recycler(const recycler&) = delete;
  recycler& operator=(const recycler&) = delete;

  /// A buffer of `n` bytes (the lease's span; empty lease for 0): an idle
  /// one by the rule above, or new memory. `*capacity`, where given,
  /// receives the bytes the buffer really has.
  [[nodiscard]] lease get(std::size_t n, std::size_t* capacity = nullptr) {
    if (n == 0) return {};
    std::size_t cap = state_->mem.capacity_for(n);
    void* p = nullptr;
    {
      std::lock_guard g(state_->mu);
      auto it = state_->idle.lower_bound(cap);
      if (it != state_->idle.end() && it->first <= 2 * cap) {
        it = std::prev(state_->idle.upper_bound(it->first));  // of that size, the one back last: its pages are warmest
        cap = it->first, p = it->second;
        state_->idle.erase(it);
        state_->idle_bytes -= cap;
        ++state_->reused;
      }
    }
    if (!p) {
      p = state_->mem.allocate(cap);
      std::lock_guard g(state_->mu);
      state_->live_bytes += cap;
      ++state_->allocations;
    }
    if (capacity) *capacity = cap;
    std::shared_ptr<void> keep(p, [s = state_, cap](void* q) noexcept { s->give_back(q, cap); });
    return lease(std::move(keep), {static_cast<std::byte*>(p), n});
  }

  /// The bytes of idle buffers kept at most: raised to `bytes` if below it.
  void reserve(std::size_t bytes) {
    std::lock_guard g(state_->mu);
    state_->cap = std::max(state_->cap, bytes);
  }
  [[nodiscard]] std::size_t capacity() const {
    std::lock_guard g(state_->mu);
    return state_->cap;
  }
  /// Frees idle buffers until at most `keep` bytes of them remain (largest
  /// first). Returns the bytes freed.
  std::size_t trim(std::size_t keep) {
    std::multimap<std::size_t, void*> freed;
    std::size_t bytes = 0;
    {
      std::lock_guard g(state_->mu);
      while (state_->idle_bytes > keep && !state_->idle.empty()) {
        auto it = std::prev(state_->idle.end());
        state_->idle_bytes -= it->first;
        bytes += it->first;
        freed.insert(*it);
        state_->idle.erase(it);
      }
    }
    state_->free_all(freed);
    return bytes;
  }
  /// Frees every idle buffer and sets the capacity to 0: buffers let go of
  /// later are freed, not kept, until reserve() is called again.
  void release() {
    std::multimap<std::size_t, void*> idle;
    {
      std::lock_guard g(state_->mu);
      idle.swap(state_->idle);
      state_->idle_bytes = 0;
      state_->cap = 0;
    }
    state_->free_all(idle);
  }
  [[nodiscard]] recycler_stats stats() const {
    std::lock_guard g(state_->mu);
    return {state_->idle_bytes, state_->live_bytes, state_->allocations, state_->reused};
  }
  [[nodiscard]] Memory& memory() noexcept { return state_->mem; }

 private:
  struct state {
    explicit state(Memory m) : mem(std::move(m)) {}
    ~state() { free_all(idle); }
    void give_back(void* p, std::size_t capacity) noexcept {
      {
        std::lock_guard g(mu);
        if (idle_bytes + capacity <= cap) {
          try {
            idle.emplace(capacity, p);
            idle_bytes += capacity;
            return;
          } catch (...) {  // no room to remember it: free it below
          }
        }
        live_bytes -= capacity;
      }
      mem.free(p, capacity);
    }
    void free_all(std::multimap<std::size_t, void*>& bufs) noexcept {
      std::size_t n = 0;
      for (auto& [c, p] : bufs) mem.free(p, c), n += c;
      bufs.clear();
      std::lock_guard g(mu);
      live_bytes -= n;
    }

    Memory mem;
    mutable std::mutex mu;
    std::multimap<std::size_t, void*> idle;  // capacity -> buffer
    std::size_t idle_bytes = 0, cap = 0, live_bytes = 0;
    std::uint64_t allocations = 0, reused = 0;
  };
  std::shared_ptr<state> state_;
};

/// A recycler for at most `Slots` buffers in use at once, each asked for by
/// its slot (a device lane's window buffers: parity x kept/scratch): between
/// windows it keeps idle what the slots have needed at most, so the next
/// window finds its buffers. Its `get` is called from one thread.
template <class Memory, std::size_t Slots>
class slot_recycler {
 public:
  explicit slot_recycler(Memory m = {}) : r_(std::move(m)) {}

  /// A buffer of `n` bytes for slot `slot` (< Slots; empty for 0).
  [[nodiscard]] lease get(std::size_t slot, std::size_t n) {
    if (n == 0) return {};
    auto& l = largest_.at(slot);
    l = std::max(l, r_.memory().capacity_for(n));
    std::size_t all = 0;
    for (auto x : largest_) all += x;
    r_.reserve(all);
    return r_.get(n);
  }
  /// The recycler itself (stats, release).
  [[nodiscard]] recycler<Memory>& all() noexcept { return r_; }
  [[nodiscard]] const recycler<Memory>& all() const noexcept { return r_; }

 private:
  recycler<Memory> r_;
  std::array<std::size_t, Slots> largest_{};
};

/// Anonymous host memory, a mapping per buffer (not malloc's: a freed buffer
/// goes back to the kernel at once; glibc serves sizes below its dynamic
/// mmap threshold, up to 32 MiB, from its heap, which keeps freed memory
/// resident: measured as tens of MiB over the budget in
/// bench/stream_memory.py): 2 MiB-aligned and advised for transparent huge
/// pages from 2 MiB up, else 4096-aligned. Throws resource_error naming the
/// size when memory cannot be had.
struct anonymous_memory {
  [[nodiscard]] std::size_t capacity_for(std::size_t n) const noexcept;
  [[nodiscard]] void* allocate(std::size_t capacity) const;
  void free(void* p, std::size_t capacity) const noexcept;
};

}  // namespace sluice::inline v0::memory
