// The registry of the communicator that joins multi-rank worlds.

#include <sluice/comm/any_communicator.hpp>

#include <mutex>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::comm {

namespace {
struct world_registry {
  std::mutex m;
  world_factory join;
};
world_registry& registry() {
  static world_registry r;
  return r;
}
}  // namespace

bool register_world(world_factory join) {
  auto& r = registry();
  std::lock_guard lock(r.m);
  r.join = std::move(join);
  return true;
}

std::unique_ptr<any_communicator> join_world(const rank_info& who) {
  world_factory join;
  {
    auto& r = registry();
    std::lock_guard lock(r.m);
    join = r.join;
  }
  if (!join)
    throw missing_component_error(
        "sluice::gloo", fmt::format("a {}-rank load needs a communicator: link sluice::gloo", who.world_size));
  return join(who);
}

}  // namespace sluice::inline v0::comm
