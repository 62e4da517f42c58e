#pragma once
/// \file
/// The staging pool: a fixed budget of host memory cut into equal slots.
/// `acquire()` suspends while every slot is leased — this is what bounds a
/// load's memory, whatever the checkpoint's size.
///
/// Memory is one anonymous mapping, aligned for O_DIRECT (and 2 MiB for
/// transparent huge pages), faulted in lazily; freed slots are reused last-in
/// first-out so a load touches as few slots as it needs. Slots are returned
/// from any thread when their last lease is released; with poisoning on,
/// a returned slot is filled with 0xDB (and ASan-poisoned in ASan builds) so
/// a use after release shows up in tests.

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <fmt/format.h>

#include <sluice/config.hpp>
#include <sluice/core/detail/waiter.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/core/task.hpp>
#include <sluice/error.hpp>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SLUICE_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SLUICE_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SLUICE_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define SLUICE_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace sluice::inline v0 {

/// The byte a poisoned (released) slot is filled with.
inline constexpr std::byte poison_byte{0xDB};

/// Memory a pool is built over instead of its own mapping (e.g. pinned host
/// memory from sluice/cuda/pinned.hpp). `region` must be 4096-byte aligned;
/// `keep` owns it and is released with the pool (after the last lease).
struct staging_memory {
  std::span<std::byte> region;
  std::shared_ptr<void> keep;
};

struct staging_options {
  std::size_t budget = std::size_t{4} << 30;      ///< total bytes of staging
  std::size_t slot_size = std::size_t{32} << 20;  ///< bytes per slot (multiple of 4096)
  bool poison = SLUICE_POISON_SLOTS;              ///< poison slots on release
  bool prefault = false;                          ///< touch every page up front
  /// External memory: when `region` is non-empty, slots are cut from it
  /// (min(budget, region.size()) bytes) and the pool maps nothing itself.
  staging_memory memory = {};
};

class staging_pool {
 public:
  /// Throws config_error if the budget cannot hold one slot.
  explicit staging_pool(staging_options opt = {}) : state_(std::make_shared<state>(opt)) {}
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;

  /// A free slot, suspending the calling coroutine until one is released.
  /// The slot returns to the pool when the last copy of the lease is released
  /// (from any thread).
  [[nodiscard]] task<lease> acquire() {
    for (;;) {
      if (auto l = state_->try_take(state_)) co_return std::move(*l);
      co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
          [s = state_.get()](auto handler) { s->wait(std::move(handler)); }, asio::use_awaitable);
    }
  }
  /// A free slot now, or nullopt.
  [[nodiscard]] std::optional<lease> try_acquire() { return state_->try_take(state_); }

  [[nodiscard]] std::size_t slot_size() const noexcept { return state_->slot_size; }
  [[nodiscard]] std::size_t slot_count() const noexcept { return state_->count; }
  [[nodiscard]] std::size_t free_count() const {
    std::lock_guard g(state_->mu);
    return state_->free.size();
  }
  /// Most slots leased at once so far.
  [[nodiscard]] std::size_t high_water() const {
    std::lock_guard g(state_->mu);
    return state_->high_water;
  }
  /// The whole mapping (for io_uring buffer registration); slot i is
  /// [i * slot_size(), (i + 1) * slot_size()).
  [[nodiscard]] std::span<std::byte> region() const noexcept { return {state_->base, state_->count * state_->slot_size}; }
  /// Index of the slot holding `p`, or -1.
  [[nodiscard]] int slot_index(const std::byte* p) const noexcept {
    if (p < state_->base || p >= state_->base + state_->count * state_->slot_size) return -1;
    return static_cast<int>(static_cast<std::size_t>(p - state_->base) / state_->slot_size);
  }

 private:
  struct state {
    explicit state(const staging_options& opt) : poison(opt.poison) {
      slot_size = (std::max<std::size_t>(opt.slot_size, 4096) + 4095) / 4096 * 4096;
      const bool external = !opt.memory.region.empty();
      const std::size_t budget = external ? std::min(opt.budget, opt.memory.region.size()) : opt.budget;
      count = budget / slot_size;
      if (count == 0)
        throw config_error(fmt::format("staging budget of {} bytes cannot hold one {}-byte slot", budget, slot_size));
      const std::size_t bytes = count * slot_size;
      if (external) {
        if (reinterpret_cast<std::uintptr_t>(opt.memory.region.data()) % 4096 != 0)
          throw config_error("external staging memory must be 4096-byte aligned");
        keep = opt.memory.keep;
        base = opt.memory.region.data();
        init(opt, bytes);
        return;
      }
      constexpr std::size_t huge = std::size_t{2} << 20;
      map_size = bytes + huge;
      void* p = ::mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw resource_error(fmt::format("cannot map {} bytes of staging memory: {}", bytes, std::strerror(errno)));
      map_base = static_cast<std::byte*>(p);
      base = map_base + (huge - reinterpret_cast<std::uintptr_t>(map_base) % huge) % huge;
      ::madvise(base, bytes, MADV_HUGEPAGE);  // a hint: THP is `madvise` on typical hosts
      init(opt, bytes);
    }
    void init(const staging_options& opt, std::size_t bytes) {
      if (opt.prefault) std::memset(base, 0, bytes);
      free.reserve(count);
      for (std::size_t i = count; i-- > 0;) free.push_back(i);  // slot 0 is taken first
      if (poison) SLUICE_ASAN_POISON(base, bytes);
    }
    ~state() {
      if (map_base) {
        ::munmap(map_base, map_size);
      } else if (poison) {
        SLUICE_ASAN_UNPOISON(base, count * slot_size);  // external memory goes back unpoisoned
      }
    }

    std::optional<lease> try_take(const std::shared_ptr<state>& self) {
      std::size_t i;
      {
        std::lock_guard g(mu);
        if (free.empty()) return std::nullopt;
        i = free.back();
        free.pop_back();
        high_water = std::max(high_water, count - free.size());
      }
      std::byte* p = base + i * slot_size;
      if (poison) SLUICE_ASAN_UNPOISON(p, slot_size);
      // The ticket's destruction (last lease gone) returns the slot.
      auto ticket = std::shared_ptr<void>(p, [self, i](void*) noexcept { self->give_back(i); });
      return lease(std::move(ticket), {p, slot_size});
    }
    void give_back(std::size_t i) noexcept {
      std::byte* p = base + i * slot_size;
      if (poison) {
        std::memset(p, static_cast<int>(poison_byte), slot_size);
        SLUICE_ASAN_POISON(p, slot_size);
      }
      std::lock_guard g(mu);
      free.push_back(i);
      waiters.wake_one();
    }
    template <class H>
    void wait(H handler) {
      std::lock_guard g(mu);
      waiters.push(std::move(handler));
      if (!free.empty()) waiters.wake_one();  // released between try_take and here
    }

    std::size_t slot_size = 0, count = 0, map_size = 0;
    std::byte* map_base = nullptr;  ///< own mapping (null for external memory)
    std::byte* base = nullptr;
    std::shared_ptr<void> keep;     ///< owner of external memory
    bool poison;
    mutable std::mutex mu;
    std::vector<std::size_t> free;
    std::size_t high_water = 0;
    detail::waiter_queue waiters;
  };
  std::shared_ptr<state> state_;
};

}  // namespace sluice::inline v0
