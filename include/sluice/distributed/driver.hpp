#pragma once
/// \file
/// The distributed driver: loads this rank's part of a checkpoint per a
/// plan. Set-up (plan check, the sink's reservation, the reader, the node's
/// shared segment and its tables) runs in order under the failure protocol;
/// then the windows flow through one pipeline,
///
///     read_window | exchange_window | deliver_window
///
/// (read_window.hpp, exchange_window.hpp, deliver_window.hpp), each stage
/// typed by what it passes on: window_ticket (the window to read, this
/// rank's status) → window_state (this rank's slices read, through
/// coalesce | fetch | stage | place, as tasks on the driver's io_context) →
/// window_state (every slice at the ranks that keep it) → window_ticket (the
/// window delivered, its stats, its delivery's status). Every read of the
/// load runs on one io_context, which this thread runs for each phase that
/// reads. See <sluice/distributed.hpp> for the whole picture.
///
/// The driver and its stages are compiled once, in the core
/// (src/core/driver.cpp), over erased parts: comm::any_communicator,
/// any_device_lane (or none), any_sink and the any_source a source_factory
/// opens. The calls below are thin typed front ends: they check at compile
/// time what the types allow (a host sink with a device lane; a static
/// topology against a communicator whose type fixes its size), refer to
/// their arguments through the erased interfaces, and call it.

#include <utility>

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>

#include <boost/asio/io_context.hpp>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/any_communicator.hpp>
#include <sluice/comm/concepts.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/comm/local.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/error.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/source/any_source.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

namespace detail {

/// The driver (src/core/driver.cpp): loads this rank's part of `ck` into `s`
/// per `plan`, exchanging the rest over `c`, reading through the sources
/// `open_source` opens (`catalog_source`: the sources are `ck`'s catalog's
/// own, which honour reader_sizing: it may be asked for a second source
/// sized for the shared tables' readers, and ranks of one node read from its
/// page cache where the catalog shares one, catalog::shares_page_cache).
/// `lane`: the device lane, or null for none. Throws as load_distributed says.
distributed_stats drive(const checkpoint& ck, comm::any_communicator& c, const policy::load_plan& plan, any_sink s,
                        const distributed_options& opt, const source_factory& open_source, bool catalog_source,
                        any_device_lane* lane);

/// The typed front ends' way into drive(): `c` and `lane` are referred to
/// through the erased interfaces (no copy; the references live for the
/// call), whatever their types, so the driver is not instantiated per
/// communicator or lane.
template <comm::communicator Comm, device_lane Lane>
distributed_stats drive_erased(const checkpoint& ck, Comm& c, const policy::load_plan& plan, any_sink s,
                               const distributed_options& opt, const source_factory& open_source, bool catalog_source,
                               Lane& lane) {
  if constexpr (!std::derived_from<Comm, comm::any_communicator>) {
    comm::communicator_ref<Comm> host(c);
    return drive_erased(ck, static_cast<comm::any_communicator&>(host), plan, s, opt, open_source, catalog_source, lane);
  } else if constexpr (std::is_same_v<Lane, no_device_lane>) {
    return drive(ck, c, plan, s, opt, open_source, catalog_source, nullptr);
  } else if constexpr (std::derived_from<Lane, any_device_lane>) {
    return drive(ck, c, plan, s, opt, open_source, catalog_source, &lane);
  } else {
    device_lane_ref<Lane> erased(lane);
    return drive(ck, c, plan, s, opt, open_source, catalog_source, &erased);
  }
}

/// A load with a device lane delivers view_kind::device views: a sink whose
/// type says it takes none does not compile (an any_sink carries its traits
/// as a value, checked by the driver before any read).
template <class Sink, class Lane>
constexpr void check_sink_takes_lane() {
  static_assert(std::is_same_v<Lane, no_device_lane> || std::is_same_v<Sink, any_sink> || takes_device_views<Sink>(),
                "sluice: a load with a device lane delivers view_kind::device views, and this sink is host-only: use "
                "cuda::device_sink (or a sink that declares `static constexpr bool device_views = true`), or load "
                "without the lane");
}

/// A plan whose topology is static names its world size in its type: a
/// communicator whose type fixes its size (comm::local: one rank) must have
/// that many ranks, at compile time; any other is checked here, before any
/// collective, with an error naming both.
template <class Topology, comm::communicator Comm>
void check_static_world(Comm& c) {
  if constexpr (Topology::is_static) {
    constexpr std::size_t world = Topology{}.world_size();
    constexpr std::size_t fixed = comm::static_size_v<Comm>;
    static_assert(fixed == std::dynamic_extent || fixed == world,
                  "sluice: the plan's static topology has a different number of ranks than the communicator's type "
                  "allows (comm::local is a world of one rank)");
    if (c.size() != world)
      throw config_error(fmt::format("the plan's static topology {} has {} ranks, the communicator {}", Topology{}.to_string(),
                                     world, c.size()));
  }
}

}  // namespace detail

/// The driver, with the data path as a parameter: loads this rank's part of
/// `ck` into `s` per `plan`, exchanging the rest over `c`, reading through
/// the source that `open_source(ioc)` returns (a std::unique_ptr to a
/// `source`, or to an any_source; its reads must run on `ioc`, the driver's
/// io_context). It is called once, after the ranks agreed on the plan and
/// inside the failure protocol: if it throws on any rank, every rank throws
/// distributed_error naming that rank ("... while reserving the sink's memory
/// and setting up I/O: ...").
/// Every rank must call it with the same checkpoint and plan. Throws
/// distributed_error (a rank failed), comm::comm_error (a peer is gone) or
/// config_error (the plan does not fit the world) — on every rank. The
/// source it returns reads the shared tables too (no table-phase sizing:
/// see load_distributed); a source that is not an any_source keeps
/// `opt.load.queue_depth` reads in flight.
///
/// With a `device_lane`, tensors destined for the device travel in its memory
/// (uploaded from the rank's reads, exchanged by the lane: NCCL) and reach the
/// sink as `view_kind::device` views; tensors for host memory still travel
/// over `c`. Without one, everything travels in host memory over `c`.
template <comm::communicator Comm, sink Sink, class OpenSource, device_lane Lane>
  requires std::invocable<OpenSource&, asio::io_context&>
distributed_stats load_distributed_with(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                        const distributed_options& opt, OpenSource open_source, Lane& lane) {
  detail::check_sink_takes_lane<Sink, Lane>();
  using S = typename std::invoke_result_t<OpenSource&, asio::io_context&>::element_type;
  static_assert(source<S>, "sluice: open_source(ioc) must return a std::unique_ptr to a sluice::source");
  const source_factory open = [&open_source, depth = opt.load.queue_depth](asio::io_context& ioc,
                                                                           const reader_sizing&) -> std::unique_ptr<any_source> {
    auto src = open_source(ioc);
    if (!src) throw config_error("load_distributed_with: open_source returned no source");
    if constexpr (std::is_same_v<S, any_source>)
      return src;
    else
      return any_source::wrap(std::move(src), depth);
  };
  return detail::drive_erased(ck, c, plan, any_sink(s), opt, open, false, lane);
}

template <comm::communicator Comm, sink Sink, class OpenSource>
  requires std::invocable<OpenSource&, asio::io_context&>
distributed_stats load_distributed_with(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                        const distributed_options& opt, OpenSource open_source) {
  no_device_lane none;
  return load_distributed_with(ck, c, plan, s, opt, std::move(open_source), none);
}

/// Loads this rank's part of `ck` into `s` per `plan`, reading through the
/// data path of the catalog `ck` was opened by (local files: io_uring; S3:
/// range GETs, the node's connections shared among its `plan.local_size`
/// ranks unless `opt.connections_per_rank` says otherwise; while the shared
/// tables are read, among the node's table readers: reader_sizing), and exchanging
/// the rest over `c`. Every rank must call it with the same checkpoint and
/// plan. Throws distributed_error (a rank failed), comm::comm_error (a peer is
/// gone) or config_error (the plan does not fit the world) — on every rank.
///
/// With a device lane (e.g. comm::nccl_lane with cuda::device_sink), tensors
/// destined for the device reach `s` as `view_kind::device` views of the
/// lane's memory; `s` must then declare that it takes them
/// (`static constexpr bool device_views = true`; a host sink does not
/// compile). An any_sink carries the traits of the sink it erases: one that
/// takes no device views fails every rank with config_error naming its type,
/// before any read.
template <comm::communicator Comm, sink Sink, device_lane Lane>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                   const distributed_options& opt, Lane& lane) {
  detail::check_sink_takes_lane<Sink, Lane>();
  const source_factory open = [&](asio::io_context& ioc, const reader_sizing& sizing) {
    return ck.storage().open_source(ck, ioc, opt.load.source(), sizing);
  };
  return detail::drive_erased(ck, c, plan, any_sink(s), opt, open, true, lane);
}

template <comm::communicator Comm, sink Sink>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                   const distributed_options& opt = {}) {
  no_device_lane none;
  return load_distributed(ck, c, plan, s, opt, none);
}

/// The typed front end: a plan whose topology and offload strategy are
/// types (policy::plan<Topology, Offload>, from
/// `plan_for(ck, policy::tp1_dp8_ep8{}, policy::offload::none{})`). Its
/// static world is checked against `c`: at compile time where `c`'s type
/// fixes its size (comm::local, a world of one), else before any collective
/// (config_error naming both). Then the compiled driver runs over the plan,
/// as for any load_plan: the topology's type selects no driver of its own.
template <class Topology, policy::offload_strategy Offload, class Shape, comm::communicator Comm, sink Sink, device_lane Lane>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::plan<Topology, Offload, Shape>& plan, Sink& s,
                                   const distributed_options& opt, Lane& lane) {
  detail::check_static_world<Topology>(c);
  return load_distributed(ck, c, static_cast<const policy::load_plan&>(plan), s, opt, lane);
}

template <class Topology, policy::offload_strategy Offload, class Shape, comm::communicator Comm, sink Sink>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::plan<Topology, Offload, Shape>& plan, Sink& s,
                                   const distributed_options& opt = {}) {
  no_device_lane none;
  return load_distributed(ck, c, plan, s, opt, none);
}

}  // namespace sluice::inline v0
