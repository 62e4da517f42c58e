// memory_cache (memory/memory_cache.hpp): the idle pool and the idle buffers.

#include <sluice/memory/memory_cache.hpp>
#include <sluice/memory/recycler.hpp>

#include <mutex>
#include <utility>

namespace sluice::inline v0 {

struct memory_cache::state {
  mutable std::mutex mu;
  std::shared_ptr<staging_pool> idle_pool;  // every slot free when put there, or soon
  std::uint64_t reused_pools = 0;
  memory::recycler<memory::anonymous_memory> buffers;
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

lease memory_cache::buffer(std::size_t size, std::size_t* capacity) { return state_->buffers.get(size, capacity); }
void memory_cache::reserve(std::size_t bytes) { state_->buffers.reserve(bytes); }
std::size_t memory_cache::capacity() const { return state_->buffers.capacity(); }
std::size_t memory_cache::trim(std::size_t keep) { return state_->buffers.trim(keep); }

void memory_cache::release() {
  std::shared_ptr<staging_pool> pool;
  {
    std::lock_guard g(state_->mu);
    pool.swap(state_->idle_pool);
  }
  state_->buffers.release();
}

memory_cache_stats memory_cache::stats() const {
  const auto b = state_->buffers.stats();
  std::lock_guard g(state_->mu);
  memory_cache_stats s;
  s.idle_pool_bytes = state_->idle_pool ? state_->idle_pool->slot_count() * state_->idle_pool->slot_size() : 0;
  s.idle_buffer_bytes = b.idle_bytes;
  s.reused_pools = state_->reused_pools;
  s.reused_buffers = b.reused;
  return s;
}

}  // namespace sluice::inline v0
