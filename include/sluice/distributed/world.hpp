#pragma once
/// \file
/// The tool-level distributed loads: plan from a topology string, join the
/// world a `comm::rank_info` describes (one rank: comm::local; more:
/// comm::gloo), open the checkpoint inside the failure protocol, load.

#include <utility>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <concepts>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/location.hpp>
#include <sluice/comm/any_communicator.hpp>
#include <sluice/comm/local.hpp>
#include <sluice/comm/store.hpp>
#include <sluice/distributed/driver.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/distributed/peers.hpp>
#include <sluice/error.hpp>
#include <sluice/policy/offload.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/policy/topology.hpp>

namespace sluice::inline v0 {

/// The plan options a load of `ck` over `world` ranks uses: `opt.plan`, with
/// smaller windows where no window will carry a message: one node whose
/// ranks take what they keep from its page cache (local files,
/// `opt.page_cache`, not io_mode::direct; schedule::node). Its windows are
/// then `window_bytes` / local ranks, at least 16 MiB and never more than
/// asked, so that the node's window buffers together are one process's
/// rather than one such set per rank: each rank lays every window out in
/// buffers the size of its largest, whose pages it touches first once per
/// load, and a window without a message costs no collective
/// (window_schedule::status) whatever its size. Measured on the 8 GiB
/// sample, 8 ranks, hot, copies: 4.1-6.3 s with 256 MiB windows, 3.3-3.5 s
/// with 32-64 MiB (bench/HISTORY.md). Between nodes, where windows carry
/// messages, bigger windows mean fewer collectives: unchanged.
[[nodiscard]] inline policy::plan_options plan_options_for(const checkpoint& ck, std::size_t world, const distributed_options& opt) {
  auto po = opt.plan;
  const auto local = po.local_size ? po.local_size : world;
  if (local >= world && opt.takes_from_page_cache(ck.storage().shares_page_cache(), local)) {  // one node
    constexpr std::uint64_t least = std::uint64_t{16} << 20;
    po.window_bytes = std::min(po.window_bytes, std::max(least, po.window_bytes / local));
  }
  return po;
}

/// The plan for `ck` under a topology ("tp1,dp8,ep8", "tp4,pp2", or a static
/// `policy::topology<...>`) and an offload strategy ("none|per-rank|shared-single|
/// shared-cooperative", or a strategy type). Literals are checked at compile
/// time (policy::topology_spec, policy::offload_spec); run-time strings are
/// parsed here, by the same parser (config_error naming the bad part).
[[nodiscard]] inline policy::load_plan plan_for(const checkpoint& ck, policy::topology_spec topology, policy::offload_spec offload,
                                                const distributed_options& opt = {}) {
  const auto topo = topology.to_topology();
  return policy::make_plan(policy::tensor_infos(ck), policy::classifier(opt.classify), topo, offload.kind(),
                           plan_options_for(ck, topo.world_size(), opt));
}

/// The typed plan for `ck`: a topology and an offload strategy given as
/// types, e.g. `plan_for(ck, policy::tp1_dp8_ep8{}, policy::offload::none{})`.
/// Nothing is parsed: the static sizes reach make_plan as template
/// arguments, and the plan it returns, a policy::plan<Topology, Offload>,
/// carries them to load_distributed, which checks them against the
/// communicator (comm::local: at compile time) before the compiled driver
/// runs over it.
template <std::size_t TP, std::size_t DP, std::size_t EP, std::size_t PP, policy::offload_strategy Offload>
[[nodiscard]] policy::plan<policy::topology<TP, DP, EP, PP>, Offload> plan_for(const checkpoint& ck,
                                                                              const policy::topology<TP, DP, EP, PP>& topology,
                                                                              Offload, const distributed_options& opt = {}) {
  return policy::plan<policy::topology<TP, DP, EP, PP>, Offload>::compute(topology, ck, policy::classifier(opt.classify),
                                                                         plan_options_for(ck, topology.world_size(), opt));
}

namespace detail {

// Joins the world `who` describes (one rank: comm::local; more: the
// registered communicator, comm::gloo through its store) and returns
// f(communicator). A static world size (a static topology's) selects the
// communicator at compile time, so f is instantiated for one of them only.
template <std::size_t World = std::dynamic_extent, class F>
distributed_stats in_world(const comm::rank_info& who, F&& f) {
  if constexpr (World == 1) {
    comm::local c;
    return f(c);
  } else {
    if constexpr (World == std::dynamic_extent)
      if (who.world_size == 1) {
        comm::local c;
        return f(c);
      }
    const auto t0 = std::chrono::steady_clock::now();
    const auto c = in_phase("joining the world", [&] { return comm::join_world(who); });
    const std::chrono::duration<double> joined = std::chrono::steady_clock::now() - t0;
    auto st = f(*c);
    st.join_seconds = joined.count();
    return st;
  }
}

// A static topology's world against WORLD_SIZE, before joining a world of
// the wrong size.
template <policy::static_topology Topology>
void check_world_size(const Topology& topology, const comm::rank_info& who) {
  if (who.world_size != topology.world_size())
    throw config_error(fmt::format("topology {} has {} ranks but WORLD_SIZE is {}", topology.to_string(),
                                   topology.world_size(), who.world_size));
}

// The tool-level plan: `topology` must have WORLD_SIZE ranks.
inline policy::load_plan tool_plan(const checkpoint& ck, policy::topology_spec topology, policy::offload_spec offload,
                                   const comm::rank_info& who, const distributed_options& opt) {
  auto plan = plan_for(ck, topology, offload, opt);
  if (plan.world != who.world_size)
    throw config_error(fmt::format("topology {} has {} ranks but WORLD_SIZE is {}", topology.text(), plan.world, who.world_size));
  return plan;
}

// What open_and_plan returns: the checkpoint, its plan and the seconds both took.
template <class Plan>
struct opened {
  checkpoint ck;
  Plan plan;
  double seconds;  ///< opening and planning, the failure protocol's status exchange included
};

// After joining the world: opens the checkpoint (`open()`) and plans it
// (`make(ck)`: a load_plan, or a typed policy::plan) inside the failure
// protocol, so that a rank that cannot open it fails every rank at once
// rather than leaving its peers to time out.
template <comm::communicator Comm, class Open, class Make>
auto open_and_plan(Comm& c, Open&& open, Make&& make) {
  using plan_type = std::invoke_result_t<Make&, const checkpoint&>;
  std::optional<checkpoint> ck;
  std::optional<plan_type> plan;
  const auto t0 = std::chrono::steady_clock::now();
  fault_point("open", c.rank());
  run_phase(c, "opening the checkpoint", [&] {
    ck.emplace(open());
    plan.emplace(make(*ck));
  });
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  return opened<plan_type>{std::move(*ck), std::move(*plan), took.count()};
}

// The load of an opened checkpoint, with the opening's time in its stats.
template <class Plan, class Load>
distributed_stats load_opened(const opened<Plan>& o, Load&& load) {
  auto st = load(o.ck, o.plan);
  st.open_seconds = o.seconds;
  return st;
}

}  // namespace detail

/// The one call for tools (sluice-load): plans `ck` for `topology` and
/// `offload`, joins the world described by `who` (one rank: comm::local;
/// more: comm::gloo through its store, in a program that links sluice::gloo;
/// without it, missing_component_error) and loads this rank's part into `s`
/// from wherever `ck` is (local files, S3).
template <sink Sink>
distributed_stats load_distributed(const checkpoint& ck, policy::topology_spec topology, policy::offload_spec offload,
                                   const comm::rank_info& who, Sink& s, distributed_options opt = {}) {
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  const auto plan = detail::tool_plan(ck, topology, offload, who, opt);
  return detail::in_world(who, [&](auto& c) { return load_distributed(ck, c, plan, s, opt); });
}

/// Like the call above, but opens the checkpoint at `where` (a path, an
/// "s3://" URI, or s3_location(uri, config)) after joining the world, once
/// for every rank: rank 0 reads the index and the headers and shares them
/// (checkpoint::open(location, communicator)), so a world of N ranks makes
/// the metadata requests of one. A rank that cannot open it (a missing or
/// corrupt shard, its own copy differing from rank 0's) makes every rank
/// throw distributed_error naming it, at once — rather than leaving its peers
/// to time out at the rendezvous. With a device lane (e.g.
/// comm::nccl_lane over `comm::nccl::connect(who, {.device = cuda::device_for_local_rank(local_rank)})`,
/// whose unique id travels through the same store), tensors destined for the
/// device reach `s` as `view_kind::device` views (cuda::device_sink).
/// Without one (the default) everything is delivered in host memory.
template <sink Sink, device_lane Lane>
distributed_stats load_distributed(const location& where, policy::topology_spec topology,
                                   policy::offload_spec offload, const comm::rank_info& who, Sink& s,
                                   distributed_options opt, const open_options& open, Lane& lane) {
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  return detail::in_world(who, [&](auto& c) {
    // Rank 0 reads the metadata for every rank (one request per header, not one per rank).
    const auto o = detail::open_and_plan(c, [&] { return checkpoint::open(where, c, open); },
                                         [&](const checkpoint& k) { return detail::tool_plan(k, topology, offload, who, opt); });
    return detail::load_opened(o, [&](const checkpoint& ck, const auto& plan) { return load_distributed(ck, c, plan, s, opt, lane); });
  });
}
/// Like the call above, with the device lane made once the world is joined:
/// `make_lane(host)` gets this rank's host communicator (comm::local for one
/// rank, else the registered world's) after the checkpoint is opened and
/// planned, and returns the lane. So the lane can take the host
/// communicator's liveness signal, `comm::liveness_of(host)`, e.g. as
/// nccl_options::liveness: a peer that dies while NCCL waits on it then ends
/// the device exchange within moments (comm::peer_lost naming it, the NCCL
/// communicator aborted) instead of at the lane's timeout. A lane made before
/// the world cannot: the world's communicator does not exist yet.
///
///   load_distributed(where, topology, offload, who, sink, opt, open, [&](auto& host) {
///     return comm::nccl_lane(comm::nccl::connect(who, {.device = dev, .liveness = comm::liveness_of(host)}));
///   });
///
/// A rank whose lane cannot be made throws; its peers, waiting for it in the
/// lane's own rendezvous (NCCL's init), end at the lane's timeout.
template <sink Sink, class MakeLane>
  requires(!device_lane<std::remove_cvref_t<MakeLane>> && std::invocable<MakeLane&, comm::local&> &&
           std::invocable<MakeLane&, comm::any_communicator&>)
distributed_stats load_distributed(const location& where, policy::topology_spec topology, policy::offload_spec offload,
                                   const comm::rank_info& who, Sink& s, distributed_options opt, const open_options& open,
                                   MakeLane&& make_lane) {
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  return detail::in_world(who, [&](auto& c) {
    const auto o = detail::open_and_plan(c, [&] { return checkpoint::open(where, c, open); },
                                         [&](const checkpoint& k) { return detail::tool_plan(k, topology, offload, who, opt); });
    auto lane = detail::in_phase("making the device lane", [&] { return make_lane(c); });
    static_assert(device_lane<decltype(lane)>, "sluice: make_lane(host) must return a device_lane");
    return detail::load_opened(o, [&](const checkpoint& ck, const auto& plan) { return load_distributed(ck, c, plan, s, opt, lane); });
  });
}

template <sink Sink>
distributed_stats load_distributed(const location& where, policy::topology_spec topology,
                                   policy::offload_spec offload, const comm::rank_info& who, Sink& s,
                                   distributed_options opt = {}, const open_options& open = {}) {
  no_device_lane none;
  return load_distributed(where, topology, offload, who, s, std::move(opt), open, none);
}

/// The tool-level calls with a static topology and an offload strategy type,
/// e.g. `load_distributed(where, policy::tp1_dp8_ep8{}, policy::offload::none{}, who, sink)`:
/// nothing is parsed; WORLD_SIZE is checked against the topology's static
/// world before joining, which also selects the communicator at compile
/// time (a world of one: comm::local; more: the registered one); the plan
/// is a policy::plan<Topology, Offload> (plan_for), checked again against
/// the communicator, and the compiled driver runs over it.
template <policy::static_topology Topology, policy::offload_strategy Offload, sink Sink>
distributed_stats load_distributed(const checkpoint& ck, const Topology& topology, Offload offload, const comm::rank_info& who,
                                   Sink& s, distributed_options opt = {}) {
  detail::check_world_size(topology, who);
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  const auto plan = plan_for(ck, topology, offload, opt);
  return detail::in_world<Topology{}.world_size()>(who, [&](auto& c) { return load_distributed(ck, c, plan, s, opt); });
}

/// As above, opening the checkpoint at `where` once for every rank after
/// joining the world (as the call with topology text does).
template <policy::static_topology Topology, policy::offload_strategy Offload, sink Sink>
distributed_stats load_distributed(const location& where, const Topology& topology, Offload offload,
                                   const comm::rank_info& who, Sink& s, distributed_options opt = {},
                                   const open_options& open = {}) {
  detail::check_world_size(topology, who);
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  return detail::in_world<Topology{}.world_size()>(who, [&](auto& c) {
    const auto o = detail::open_and_plan(c, [&] { return checkpoint::open(where, c, open); },
                                         [&](const checkpoint& k) { return plan_for(k, topology, offload, opt); });
    return detail::load_opened(o, [&](const checkpoint& ck, const auto& plan) { return load_distributed(ck, c, plan, s, opt); });
  });
}

}  // namespace sluice::inline v0
