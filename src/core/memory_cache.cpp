// memory_cache (memory_cache.hpp): the idle pool and the idle buffers.

#include <sluice/memory_cache.hpp>

#include <sys/mman.h>

#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0 {

namespace {
constexpr std::size_t huge_page = std::size_t{2} << 20;
std::size_t alignment_for(std::size_t n) { return n >= huge_page ? huge_page : 4096; }
std::size_t capacity_for(std::size_t n) {
  const auto a = alignment_for(n);
  return n == 0 ? 4096 : (n + a - 1) / a * a;
}

// Buffers are mappings of their own, not malloc's: a freed one goes back to
// the kernel at once. (glibc serves sizes below its dynamic mmap threshold,
// up to 32 MiB, from its heap, which keeps freed memory resident: measured
// as tens of MiB over the budget in bench/stream_memory.py.)
void* map_buffer(std::size_t cap) {
  const std::size_t align = alignment_for(cap);
  const std::size_t extra = align > 4096 ? align : 0;
  void* m = ::mmap(nullptr, cap + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* base = static_cast<std::byte*>(m);
  auto* p = base + (align - reinterpret_cast<std::uintptr_t>(base) % align) % align;
  if (extra) {  // keep the aligned part only
    if (p > base) ::munmap(base, static_cast<std::size_t>(p - base));
    if (const auto tail = static_cast<std::size_t>(base + cap + extra - (p + cap))) ::munmap(p + cap, tail);
    ::madvise(p, cap, MADV_HUGEPAGE);  // a hint: first touch then faults 2 MiB at a time
  }
  return p;
}
void unmap_buffer(void* p, std::size_t cap) noexcept { ::munmap(p, cap); }
}  // namespace

struct memory_cache::state {
  mutable std::mutex mu;
  std::shared_ptr<staging_pool> idle_pool;       // every slot free when put there, or soon
  std::multimap<std::size_t, void*> idle;        // capacity -> buffer
  std::size_t idle_bytes = 0, cap = 0;
  std::uint64_t reused_pools = 0, reused_buffers = 0;

  ~state() {
    for (auto& [n, p] : idle) unmap_buffer(p, n);
  }
  void give_back(void* p, std::size_t capacity) noexcept {
    {
      std::lock_guard g(mu);
      if (idle_bytes + capacity <= cap) {
        idle.emplace(capacity, p);
        idle_bytes += capacity;
        return;
      }
    }
    unmap_buffer(p, capacity);
  }
};

memory_cache::memory_cache() : state_(std::make_shared<state>()) {}
memory_cache::~memory_cache() = default;

memory_cache& memory_cache::process() {
  static auto* c = new memory_cache;
  return *c;
}

std::shared_ptr<staging_pool> memory_cache::pool(const staging_options& o) {
  const std::size_t slot = (std::max<std::size_t>(o.slot_size, 4096) + 4095) / 4096 * 4096;
  {
    std::lock_guard g(state_->mu);
    auto& p = state_->idle_pool;
    if (p && o.memory.region.empty() && p->slot_size() == slot && p->slot_count() == o.budget / slot &&
        p->free_count() == p->slot_count()) {
      ++state_->reused_pools;
      return std::exchange(p, nullptr);
    }
  }
  return std::make_shared<staging_pool>(o);
}

void memory_cache::put_pool(std::shared_ptr<staging_pool> p) {
  std::shared_ptr<staging_pool> old;
  std::lock_guard g(state_->mu);
  old = std::exchange(state_->idle_pool, std::move(p));  // unmapped after the lock (its last lease may be elsewhere)
}

lease memory_cache::buffer(std::size_t size, std::size_t* capacity) {
  void* p = nullptr;
  std::size_t cap = capacity_for(size);
  {
    std::lock_guard g(state_->mu);
    auto it = state_->idle.lower_bound(cap);
    if (it != state_->idle.end() && it->first <= 2 * cap) {
      cap = it->first;
      p = it->second;
      state_->idle.erase(it);
      state_->idle_bytes -= cap;
      ++state_->reused_buffers;
    }
  }
  if (!p) {
    p = map_buffer(cap);
    if (!p) throw resource_error(fmt::format("cannot map {} bytes for a tensor", size));
  }
  if (capacity) *capacity = cap;
  std::shared_ptr<void> keep(p, [s = state_, cap](void* q) noexcept { s->give_back(q, cap); });
  return lease(std::move(keep), {static_cast<std::byte*>(p), size});
}

void memory_cache::reserve(std::size_t bytes) {
  std::lock_guard g(state_->mu);
  state_->cap = std::max(state_->cap, bytes);
}

std::size_t memory_cache::capacity() const {
  std::lock_guard g(state_->mu);
  return state_->cap;
}

std::size_t memory_cache::trim(std::size_t keep) {
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
  for (auto& [n, p] : freed) unmap_buffer(p, n);
  return bytes;
}

void memory_cache::release() {
  std::multimap<std::size_t, void*> buffers;
  std::shared_ptr<staging_pool> pool;
  {
    std::lock_guard g(state_->mu);
    buffers.swap(state_->idle);
    pool.swap(state_->idle_pool);
    state_->idle_bytes = 0;
    state_->cap = 0;
  }
  for (auto& [n, p] : buffers) unmap_buffer(p, n);
}

memory_cache_stats memory_cache::stats() const {
  std::lock_guard g(state_->mu);
  memory_cache_stats s;
  s.idle_pool_bytes = state_->idle_pool ? state_->idle_pool->slot_count() * state_->idle_pool->slot_size() : 0;
  s.idle_buffer_bytes = state_->idle_bytes;
  s.reused_pools = state_->reused_pools;
  s.reused_buffers = state_->reused_buffers;
  return s;
}

}  // namespace sluice::inline v0
