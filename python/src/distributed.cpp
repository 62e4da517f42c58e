// The distributed load for the Python package: the driver instantiated once,
// over any_sink (the costly translation unit, kept apart from the bindings so
// that the two compile in parallel).
#include "glue.hpp"

#include <optional>

#include <sluice/comm/any_communicator.hpp>
#include <sluice/distributed.hpp>
#include <sluice/distributed/peers.hpp>

namespace sluice_py {

nlohmann::json run_distributed(const checkpoint& ck, const distributed_request& req, any_sink s, distributed_options opt,
                               std::unique_ptr<comm::any_communicator> world) {
  distributed_stats st;
  const bool reused = world != nullptr;
  if (world) {
    // world.hpp's tool-level call, over the world the collective open joined.
    if (!opt.plan.local_size) opt.plan.local_size = req.who.local_size;
    const auto plan = detail::tool_plan(ck, req.topology, req.offload, req.who, opt);
    st = load_distributed(ck, *world, plan, s, opt);
  } else {
    st = load_distributed(ck, req.topology, req.offload, req.who, s, std::move(opt));
  }
  auto j = st.to_json();
  j["tensor_bytes"] = ck.tensor_bytes();
  j["reused_open_world"] = reused;  // one Gloo world for the open and the load
  const double gib = static_cast<double>(st.bytes_read + st.bytes_received + st.page_cache_bytes + st.node_copied_bytes) / double(1ull << 30);
  j["gib_per_s"] = st.seconds > 0 ? gib / st.seconds : 0.0;
  return j;
}

checkpoint open_collective(const location& where, const open_options& opt, const comm::rank_info& who,
                           opened_world* keep) {
  if (who.world_size <= 1) return checkpoint::open(where, opt);
  auto c = detail::in_phase("joining the world to open the checkpoint", [&] { return comm::join_world(who); });
  std::optional<checkpoint> ck;
  std::exception_ptr failure;
  try {
    ck.emplace(checkpoint::open(where, *c, opt));
  } catch (...) {
    failure = std::current_exception();
  }
  try {
    detail::check_peers(*c, failure, "opening the checkpoint");
  } catch (const distributed_error&) {
    if (failure) std::rethrow_exception(failure);  // its own error, typed (the file, the rule), not a peer's summary
    throw;
  }
  if (keep) {
    std::lock_guard g(keep->mu);
    keep->c = std::move(c);
    keep->who = who;
  }
  return std::move(*ck);
}

}  // namespace sluice_py
