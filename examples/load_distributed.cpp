// sluice-load's distributed load (see load_tool.hpp): the world from
// the flags or torchrun's environment, the host or device (NCCL) sink, the
// summary line and JSON.

#include "load_tool.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/distributed.hpp>
#include <sluice/format/name_pattern.hpp>
#include <sluice/sink/discard_sink.hpp>
#include <sluice/sink/forwarding_sink.hpp>
#if SLUICE_HAS_S3
#include <sluice/s3/distributed.hpp>
#include <sluice/s3/source.hpp>
#endif
#if SLUICE_HAS_NCCL
#include <sluice/nccl/lane.hpp>
#include <sluice/cuda/device_sink.hpp>
#endif

#include "common/cli.hpp"

namespace sluice_load {

using namespace sluice;
using sluice_cli::human_bytes;

open_options open_options_of(const options& o) {
  open_options oo;
  if (!o.select.empty()) {
    oo.select = sluice::format::matching(o.select);
  }
  oo.index = o.index_file;
  return oo;
}

namespace {
#if SLUICE_HAS_S3
// The S3 configuration from the environment, with --connections applied.
s3::config s3_config_for(const options& o) {
  auto cfg = s3::config::from_environment();
  if (o.connections) cfg.max_connections = o.connections;
  if (!o.cache_dir.empty()) cfg.cache.dir = o.cache_dir;
  if (o.cache_max) cfg.cache.max_bytes = o.cache_max;
  return cfg;
}
#endif

// The process's cache counters (the last cache it used), if any.
struct cache_figures {
  std::uint64_t hit = 0, fetched = 0, refetched = 0;
  std::uint64_t bad_blocks = 0, hashed_bytes = 0, hash_ns = 0, written = 0, unwritten = 0, evicted = 0;
  std::string dir;
};
std::optional<cache_figures> process_cache() {
#if SLUICE_HAS_S3
  auto c = cache::block_cache::last_used();
  if (!c) return std::nullopt;
  const auto& s = *c->stats;
  return cache_figures{s.hit_bytes.load(), s.fetched_bytes.load(), s.refetched_bytes.load(), s.bad_blocks.load(), s.hashed_bytes.load(), s.hash_ns.load(), s.written_blocks.load(),
                       s.unwritten_blocks.load(), s.evicted_blocks.load(), c->dir};
#else
  return std::nullopt;
#endif
}

#if SLUICE_HAS_NCCL
// The device sink of --device, recording what this rank holds (for --digest).
// Everything else (device_views, finish, reserve) is forwarded to it.
struct device_recording : forwarding_sink<cuda::device_sink> {
  using forwarding_sink::forwarding_sink;
  std::map<std::string, tensor_view> owned;  // last view of each tensor this rank holds (placeholders: dropped)
  bool accept(tensor_view v) {
    if (!v.carries_data()) return false;
    tensor_view meta;
    meta.tensor = v.tensor, meta.part = v.part, meta.kind = view_kind::metadata;
    owned[v.name()] = meta;
    return forwarding_sink::accept(std::move(v));
  }
};
#endif

}  // namespace

std::string cache_summary() {
  const auto c = process_cache();
  if (!c) return {};
  const double gib = static_cast<double>(c->hashed_bytes) / double(1ull << 30);
  return fmt::format("cache {}: {} of blocks read from it, {} fetched ({} again: {} bad blocks), {} blocks written{}{}; "
                     "XXH3 {:.3f} s/GiB",
                     c->dir, human_bytes(static_cast<double>(c->hit)), human_bytes(static_cast<double>(c->fetched)),
                     human_bytes(static_cast<double>(c->refetched)), c->bad_blocks, c->written,
                     c->unwritten ? fmt::format(", {} not written", c->unwritten) : "",
                     c->evicted ? fmt::format(", {} evicted", c->evicted) : "",
                     gib > 0 ? static_cast<double>(c->hash_ns) / 1e9 / gib : 0.0);
}

std::string cache_progress() {
#if SLUICE_HAS_S3
  const auto c = cache::block_cache::last_used();
  if (!c) return {};
  return fmt::format("  cache: {} from it, {} from S3", human_bytes(static_cast<double>(c->stats->hit_bytes.load())),
                     human_bytes(static_cast<double>(c->stats->fetched_bytes.load())));
#else
  return {};
#endif
}

nlohmann::ordered_json cache_json() {
  const auto c = process_cache();
  if (!c) return nullptr;
  const double gib = static_cast<double>(c->hashed_bytes) / double(1ull << 30);
  return {{"dir", c->dir},           {"bad_blocks", c->bad_blocks},   {"written_blocks", c->written},
          {"unwritten_blocks", c->unwritten}, {"evicted_blocks", c->evicted}, {"hashed_bytes", c->hashed_bytes},
          {"hash_seconds_per_gib", gib > 0 ? static_cast<double>(c->hash_ns) / 1e9 / gib : 0.0}};
}

// The checkpoint's location: a path, or an S3 URI whose catalog (and its
// config, from the environment) is made only when the location is opened —
// in a distributed load, after joining the world, so that a rank without
// credentials fails every rank at once.
location where_of(const options& o) {
  if (!o.source.starts_with("s3://")) return location(o.source);
#if SLUICE_HAS_S3
  return location(o.source, [&o] { return std::make_shared<s3_catalog>(o.source, s3_config_for(o)); });
#else
  throw config_error("this sluice-load was built without the s3 component");
#endif
}

int run_distributed(const options& o) {
  auto who = comm::rank_info::from_env();
  if (o.rank) who.rank = *o.rank;
  if (o.world) who.world_size = *o.world;
  who.local_rank = o.local_rank.value_or(o.rank ? who.rank : who.local_rank);
  if (o.local_world) who.local_size = *o.local_world;
  else if (o.world && !std::getenv("LOCAL_WORLD_SIZE")) who.local_size = who.world_size;
  if (who.rank >= who.world_size) throw config_error(fmt::format("rank {} is not below the world size {}", who.rank, who.world_size));
  distributed_options dopt;
  dopt.load = o.load;
  dopt.connections_per_rank = o.connections_per_rank;
  dopt.page_cache = dopt.node_window = !o.exchange_all;
  dopt.status_every = o.status_every;
  if (o.window_bytes) dopt.plan.window_bytes = o.window_bytes;
  if (o.pieces_above) dopt.pieces_above = *o.pieces_above;
  dopt.overlap = sluice_cli::auto_on_off<distributed_options::overlap_mode>("--overlap", o.overlap);
  if (o.uneven == "keep-whole") dopt.plan.uneven_tp_keep_whole = true;
  else if (o.uneven != "error") throw config_error(fmt::format("--uneven '{}': expected error or keep-whole", o.uneven));
  dopt.plan.experts = policy::parse_expert_placement(o.experts);
  const open_options oo = open_options_of(o);
  const std::string topo = o.topology.empty() ? fmt::format("tp1,dp{},ep{}", who.world_size, who.world_size) : o.topology;
  owned_digests digests;
  discard_sink discard;
  const auto where = where_of(o);
  auto run = [&](auto& sink, auto& lane) -> distributed_stats {
    return load_distributed(where, topo, o.offload, who, sink, dopt, oo, lane);
  };
  distributed_stats st;
  std::vector<std::string> digest_lines;
  if (o.device) {
#if SLUICE_HAS_NCCL
    // The device sink first (without a driver it fails here, on every rank,
    // before any collective), then NCCL through the store once the world is
    // joined: a dead peer's host connections then abort NCCL's waits too.
    const int dev = cuda::device_for_local_rank(who.local_rank);
    cuda::device_sink sink({.device = dev});
    device_recording rec{sink};
    st = load_distributed(where, topo, o.offload, who, rec, dopt, oo, [&](auto& host) {
      const comm::nccl_options nopt{.device = dev, .liveness = comm::liveness_of(host)};
      // One rank needs no rendezvous; more exchange NCCL's unique id through the store.
      return comm::nccl_lane(who.world_size == 1 ? comm::nccl(0, 1, comm::nccl::make_unique_id(), nopt)
                                                 : comm::nccl::connect(who, nopt));
    });
    if (o.digest)
      for (const auto& [name, meta] : rec.owned) {  // copied back from the device and hashed
        std::vector<std::byte> host(sink.get(name).size);
        sink.download(name, host);
        digest_sink d;
        tensor_view v = meta;
        v.kind = view_kind::bytes;
        v.bytes = host;
        d.accept(std::move(v));
        digest_lines.push_back(d.digests().at(name).line());
      }
#else
    throw config_error("--device: this sluice-load was built without the nccl component (CUDA toolkit and NCCL)");
#endif
  } else {
    no_device_lane none;
    // One sink type for both (the driver is instantiated once for them, not twice).
    keeping_sink keeper{o.digest ? &digests : nullptr, {}};
    any_sink host = o.keep ? any_sink(keeper) : o.digest ? any_sink(digests) : any_sink(discard);
    st = run(host, none);
    if (o.digest)
      for (const auto& [name, d] : digests.d.digests()) digest_lines.push_back(d.line());
  }
  auto j = st.to_json();
  j["peak_rss_bytes"] = sluice_cli::peak_rss();
  if (auto cj = cache_json(); !cj.is_null()) j["cache"].update(cj);
  for (const auto& line : digest_lines) std::printf("%s\n", line.c_str());
  std::string out = o.json_out;
  if (out.empty())
    if (const char* e = std::getenv("SLUICE_JSON_OUT")) out = e;
  if (!out.empty()) {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
    if (!f) return sluice_cli::fail(fmt::format("cannot write '{}'", out));
  }
  if (o.json) std::printf("%s\n", j.dump(2).c_str());
  else
    std::fprintf(stderr, "rank %zu/%zu (%s, offload %s): %llu tensors delivered, read %s from storage, received %s, "
                         "%s from the page cache, %s from the node window, shared segment %s, %s%.2f s\n",
                 who.rank, who.world_size, topo.c_str(), o.offload.c_str(), static_cast<unsigned long long>(st.tensors),
                 human_bytes(static_cast<double>(st.bytes_read)).c_str(), human_bytes(static_cast<double>(st.bytes_received)).c_str(),
                 human_bytes(static_cast<double>(st.page_cache_bytes)).c_str(),
                 human_bytes(static_cast<double>(st.node_copied_bytes)).c_str(),
                 human_bytes(static_cast<double>(st.shared_bytes)).c_str(),
                 st.connections ? fmt::format("{} S3 connections, ", st.connections).c_str() : "", st.seconds);
  if (!o.json)
    if (auto line = cache_summary(); !line.empty())
      std::fprintf(stderr, "rank %zu: %s\n", who.rank, line.c_str());
  if (!o.json && !st.kept_whole.empty() && who.rank == 0)
    std::fprintf(stderr, "kept whole (TP %s does not divide them, --uneven keep-whole): %s\n", topo.c_str(),
                 fmt::format("{}", fmt::join(st.kept_whole, ", ")).c_str());
  return 0;
}

}  // namespace sluice_load
