// sluice-load: load a checkpoint (a directory or one .safetensors file) with a
// live progress display and a summary. See --help.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <map>
#include <iostream>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/distributed.hpp>
#include <sluice/probe.hpp>
#include <sluice/sluice.hpp>
#if SLUICE_HAS_S3
#include <sluice/s3/distributed.hpp>
#include <sluice/s3/source.hpp>
#endif

#if SLUICE_HAS_NCCL
#include <sluice/nccl/lane.hpp>
#include <sluice/cuda/device_sink.hpp>
#endif

#include "common/args.hpp"
#include "common/cli.hpp"

namespace {

using namespace sluice;
using sluice_cli::human_bytes;

struct options {
  std::string source;
  load_options load;
  std::string select, index_file, json_out, contract_out, topology, offload = "none", overlap = "auto", uneven = "error",
              experts = "linear";
  std::optional<std::size_t> rank, world, local_rank, local_world;
  std::size_t connections_per_rank = 0;
  std::size_t connections = 0;  // 0: the S3 config's default
  bool digest = false, json = false, progress = true, probe = false, device = false;
};

// Fills `o` from the command line; an exit code when the tool stops there
// (--help, or a usage error already reported on stderr).
std::optional<int> parse(options& o, int argc, char** argv) {
  CLI::App app("sluice-load: load a checkpoint (a directory or one .safetensors file) with a live progress\n"
               "display and a summary.",
               "sluice-load");
  app.get_formatter()->column_width(28);
  std::string staging, max_read;
  bool direct = false, buffered = false;
  const auto index = [](std::optional<std::size_t>& into) { return [&into](std::size_t v) { into = v; }; };
  app.add_option("SOURCE", o.source,
                 "checkpoint directory, .safetensors file, or s3://bucket/prefix/\n"
                 "(credentials, region and endpoint from AWS_* variables and ~/.aws)");
  app.add_option("--staging", staging, "staging budget (default 4GiB); sizes take KiB/MiB/GiB suffixes")->type_name("SIZE");
  app.add_option("--max-read", max_read, "bytes per read request (default 32MiB)")->type_name("SIZE");
  app.add_option("--queue-depth", o.load.queue_depth, "reads in flight (default 4)")->type_name("N");
  app.add_option("--threads", o.load.threads, "io_context threads (default 1)")->type_name("N");
  app.add_flag("--direct", direct, "require O_DIRECT (default: O_DIRECT when aligned)");
  app.add_flag("--buffered", buffered, "always use the page cache");
  app.add_flag_callback("--inline-copies", [&] { o.load.punt_buffered = false; },
                        "copy page-cache hits in the submitting thread, not in io_uring's\n"
                        "io-wq workers (default: workers, so cached reads copy on several cores)");
  app.add_option("--select", o.select, "load only tensors whose name matches")->type_name("REGEX");
  app.add_option("--index", o.index_file,
                 "open SOURCE through this local index instead of its own; the shards it names are\n"
                 "verified against what SOURCE lists (presence, size, ETag) before any tensor is read")
      ->type_name("FILE");
  app.add_flag("--digest", o.digest, "print name, dtype, shape, sha256 per tensor (sorted by name)");
  app.add_flag("--json", o.json, "print the summary as JSON on stdout");
  app.add_option("--json-out", o.json_out, "write the JSON summary to FILE")->type_name("FILE");
  app.add_flag_callback("--no-progress", [&] { o.progress = false; }, "no progress display");
  app.add_option("--topology", o.topology,
                 "act as one rank of a distributed load (rank from --rank/--world-size or\n"
                 "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, SLUICE_STORE_DIR; see sluice-launch)")
      ->type_name("tp1,dp8,ep8");
  app.add_option("--uneven", o.uneven,
                 "error | keep-whole: with --topology, a tensor TP should split but does not divide is\n"
                 "an error naming it (default), or kept whole on every owner and listed in the summary")
      ->type_name("MODE");
  app.add_option("--offload", o.offload, "none | per-rank | shared-single | shared-cooperative (default none)")
      ->type_name("MODE");
  app.add_option("--expert-placement", o.experts,
                 "linear | round_robin: with --topology, which EP rank holds routed expert e: blocks\n"
                 "(e * EP / E, the default) or interleaved (e % EP), as vLLM's --expert-placement-strategy")
      ->type_name("MODE");
  app.add_option("--overlap", o.overlap,
                 "read the next window while this one's collective runs (default auto:\n"
                 "on with at least two hardware threads per local rank)")
      ->type_name("auto|on|off");
  app.add_option_function<std::size_t>("--rank", index(o.rank), "override RANK")->type_name("N");
  app.add_option_function<std::size_t>("--world-size", index(o.world), "override WORLD_SIZE")->type_name("N");
  app.add_option_function<std::size_t>("--local-rank", index(o.local_rank), "override LOCAL_RANK")->type_name("N");
  app.add_option_function<std::size_t>("--local-world-size", index(o.local_world), "override LOCAL_WORLD_SIZE")
      ->type_name("N");
  app.add_flag("--device", o.device,
               "with --topology: one GPU per rank (device = local rank % visible GPUs, so a\n"
               "rank that sees only its own GPU through CUDA_VISIBLE_DEVICES uses device 0):\n"
               "tensors for the device travel by NCCL (unique id through the store:\n"
               "SLUICE_STORE_DIR or SLUICE_STORE=redis://...) into device memory; offloaded\n"
               "tables stay in host memory; --digest copies everything back (needs the nccl\n"
               "component and a GPU)");
  app.add_option("--connections", o.connections, "s3://: S3 connections (concurrent range GETs) of the node (default 16)")
      ->type_name("N");
  app.add_option("--connections-per-rank", o.connections_per_rank,
                 "s3:// with --topology: connections of each rank's S3 client (default: the\n"
                 "per-node pool size, 16, divided among the node's ranks, LOCAL_WORLD_SIZE)")
      ->type_name("N");
  app.add_flag("--probe", o.probe, "read headers only: print the per-layer plan (keys, tensors, bytes)");
  app.add_option("--contract-out", o.contract_out, "with --probe: write the load contract (JSON) to FILE")
      ->type_name("FILE");
  if (auto rc = sluice_cli::parse_args(app, argc, argv, 1)) return rc;
  if (!staging.empty()) o.load.staging_budget = sluice_cli::parse_size(staging);
  if (!max_read.empty()) o.load.max_read = sluice_cli::parse_size(max_read);
  if (direct && buffered) throw config_error("--direct and --buffered exclude each other");
  if (direct) o.load.io = io_mode::direct;
  if (buffered) o.load.io = io_mode::buffered;
  if (app.count("--connections") && o.connections == 0) throw config_error("--connections must be at least 1");
  if (o.source.empty()) throw config_error("no SOURCE given (see --help)");
  if (!o.contract_out.empty() && !o.probe) throw config_error("--contract-out needs --probe");
  if (o.device && o.topology.empty()) throw config_error("--device needs --topology (it places one rank's tensors on its GPU)");
  return std::nullopt;
}

// Progress on a terminal: one line redrawn; otherwise a plain line every 2 s.
class progress_display {
 public:
  progress_display(const load_progress& p, bool enabled) : p_(p) {
    if (enabled) th_ = std::thread([this] { loop(); });
  }
  ~progress_display() { stop(); }
  void stop() {
    {
      std::lock_guard g(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (th_.joinable()) th_.join();
  }

 private:
  void loop() {
    const bool tty = ::isatty(STDERR_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, tty ? std::chrono::milliseconds(200) : std::chrono::seconds(2), [&] { return done_; })) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double done = static_cast<double>(p_.bytes_done.load()), total = static_cast<double>(p_.total_bytes.load());
      const double rate = s > 0 ? done / s : 0;
      const double eta = rate > 0 ? (total - done) / rate : 0;
      const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
      const int filled = pct * 30 / 100;
      auto line = fmt::format("[{:<30}] {:3d}%  {} / {}  {:.2f} GiB/s  ETA {:.0f}s  {}/{} tensors",
                              std::string(static_cast<std::size_t>(filled), '#'), pct, human_bytes(done), human_bytes(total),
                              rate / (1 << 30), eta, p_.tensors_done.load(), p_.total_tensors.load());
      std::fprintf(stderr, tty ? "\r%s\033[K" : "%s\n", line.c_str());
    }
    if (tty) std::fprintf(stderr, "\r\033[K");
  }
  const load_progress& p_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread th_;
};

// Digests of what this rank holds: placeholders (tensors it does not own) are skipped.
struct owned_digests {
  digest_sink d;
  bool accept(tensor_view v) { return v.carries_data() ? d.accept(std::move(v)) : false; }
};

#if SLUICE_HAS_S3
// The S3 configuration from the environment, with --connections applied.
s3::config s3_config_for(const options& o) {
  auto cfg = s3::config::from_environment();
  if (o.connections) cfg.max_connections = o.connections;
  return cfg;
}
#endif

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
  using om = distributed_options::overlap_mode;
  if (o.overlap == "auto") dopt.overlap = om::automatic;
  else if (o.overlap == "on") dopt.overlap = om::on;
  else if (o.overlap == "off") dopt.overlap = om::off;
  else throw config_error(fmt::format("--overlap '{}': expected auto, on or off", o.overlap));
  if (o.uneven == "keep-whole") dopt.plan.uneven_tp_keep_whole = true;
  else if (o.uneven != "error") throw config_error(fmt::format("--uneven '{}': expected error or keep-whole", o.uneven));
  dopt.plan.experts = policy::parse_expert_placement(o.experts);
  open_options oo;
  if (!o.select.empty()) {
    auto re = std::make_shared<std::regex>(o.select);
    oo.select = [re](std::string_view n) { return std::regex_search(n.begin(), n.end(), *re); };
  }
  oo.index = o.index_file;
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
    any_sink host = o.digest ? any_sink(digests) : any_sink(discard);
    st = run(host, none);
    if (o.digest)
      for (const auto& [name, d] : digests.d.digests()) digest_lines.push_back(d.line());
  }
  auto j = st.to_json();
  j["peak_rss_bytes"] = sluice_cli::peak_rss();
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
                         "shared segment %s, %s%.2f s\n",
                 who.rank, who.world_size, topo.c_str(), o.offload.c_str(), static_cast<unsigned long long>(st.tensors),
                 human_bytes(static_cast<double>(st.bytes_read)).c_str(), human_bytes(static_cast<double>(st.bytes_received)).c_str(),
                 human_bytes(static_cast<double>(st.shared_bytes)).c_str(),
                 st.connections ? fmt::format("{} S3 connections, ", st.connections).c_str() : "", st.seconds);
  if (!o.json && !st.kept_whole.empty() && who.rank == 0)
    std::fprintf(stderr, "kept whole (TP %s does not divide them, --uneven keep-whole): %s\n", topo.c_str(),
                 fmt::format("{}", fmt::join(st.kept_whole, ", ")).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  if (auto rc = parse(o, argc, argv)) return *rc;
  open_options oo;
  if (!o.select.empty()) {
    auto re = std::make_shared<std::regex>(o.select);
    oo.select = [re](std::string_view n) { return std::regex_search(n.begin(), n.end(), *re); };
  }
  oo.index = o.index_file;
  const double cpu0 = sluice_cli::cpu_seconds();
  if (o.probe) {
    // Metadata only: the plan and the contract from the headers; no tensor byte is read.
    // Opened through a catalog whose counter sees every byte the probe reads
    // (a single file: its directory's catalog; only that file is opened).
    // Its catalog's counters see every byte the probe reads (a single file:
    // its directory's catalog; only that file is opened).
    const auto probed = checkpoint::open(where_of(o), oo);
    const io_counters* storage = &probed.storage().counters();
    auto report = probe_contract(probed);
    if (!o.contract_out.empty()) manifest::save(report.contract, o.contract_out);
    auto j = report.plan.to_json();
    // Tensor bytes the probe read: what storage delivered beyond the headers.
    j["bytes_read"] = storage->bytes_read.load() - probed.header_bytes_read();
    j["source"] = o.source;
    // With a topology: which rank reads how many bytes of each layer.
    std::map<std::int64_t, std::map<std::size_t, std::uint64_t>> readers;
    if (!o.topology.empty()) {
      const auto placement = plan_for(probed, o.topology, o.offload, [&] {
        distributed_options popt;
        popt.plan.uneven_tp_keep_whole = o.uneven == "keep-whole";
        popt.plan.experts = policy::parse_expert_placement(o.experts);
        return popt;
      }());
      const manifest::layer_grouping layers;
      for (const auto& e : placement.entries)
        for (const auto& r : e.reads) readers[layers.layer_of(e.info.name)][r.reader] += r.size;
      for (auto& l : j["layers"]) {
        const auto layer = l["layer"].is_null() ? manifest::non_layer : l["layer"].get<std::int64_t>();
        nlohmann::json rj = nlohmann::json::object();
        for (const auto& [rank, bytes] : readers[layer]) rj[std::to_string(rank)] = bytes;
        l["read_bytes_by_rank"] = rj;
      }
      j["topology"] = o.topology;
      j["offload"] = o.offload;
      j["expert_placement"] = placement.experts_placed == policy::expert_placement::round_robin ? "round_robin" : "linear";
    }
    if (!o.json_out.empty()) {
      std::ofstream f(o.json_out);
      f << j.dump(2) << "\n";
      if (!f) return sluice_cli::fail(fmt::format("cannot write '{}'", o.json_out));
    }
    if (o.json)
      std::printf("%s\n", j.dump(2).c_str());
    else {
      print_probe_plan(std::cout, report.plan);
      if (!readers.empty()) {
        std::printf("\nreaders under %s, offload %s (rank: bytes read from storage)\n", o.topology.c_str(), o.offload.c_str());
        for (const auto& [layer, by_rank] : readers) {
          std::string line;
          for (const auto& [rank, bytes] : by_rank) line += fmt::format(" {}:{}", rank, bytes);
          std::printf("%-20s%s\n", layer == manifest::non_layer ? "non-layer" : std::to_string(layer).c_str(), line.c_str());
        }
      }
    }
    return 0;
  }
  if (!o.topology.empty() || std::getenv("WORLD_SIZE")) return run_distributed(o);
  load_progress progress;
  o.load.progress = &progress;
  load_stats st;
  digest_sink digests;
  discard_sink discard;
  const auto opened = checkpoint::open(where_of(o), oo);
  {
    progress_display display(progress, o.progress && !o.json);
    st = o.digest ? load(opened, digests, o.load) : load(opened, discard, o.load);
  }
  const checkpoint& ck = opened;
  const double cpu = sluice_cli::cpu_seconds() - cpu0;
  const double gib = static_cast<double>(st.tensor_bytes) / (1 << 30);
  nlohmann::ordered_json j = {{"source", o.source}, {"shards", ck.shards().size()}};
  j.update(st.to_json());
  j["staging"]["budget"] = o.load.staging_budget;
  j["cpu_seconds"] = cpu;
  j["cpu_seconds_per_gib"] = gib > 0 ? cpu / gib : 0;
  j["peak_rss_bytes"] = sluice_cli::peak_rss();
  if (o.digest)
    for (const auto& [name, d] : digests.digests()) std::printf("%s\n", d.line().c_str());
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    f << j.dump(2) << "\n";
    if (!f) return sluice_cli::fail(fmt::format("cannot write '{}'", o.json_out));
  }
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fprintf(stderr, "loaded %llu tensors, %s from %zu shard(s) in %.2f s: %.2f GiB/s; %llu read requests; "
                         "CPU %.2f s (%.2f s/GiB); peak RSS %s (staging %s, %zu of %zu slots used)\n",
                 static_cast<unsigned long long>(st.tensors), human_bytes(static_cast<double>(st.tensor_bytes)).c_str(),
                 ck.shards().size(), st.seconds, st.seconds > 0 ? gib / st.seconds : 0.0,
                 static_cast<unsigned long long>(st.requests), cpu, gib > 0 ? cpu / gib : 0.0,
                 human_bytes(static_cast<double>(sluice_cli::peak_rss())).c_str(),
                 human_bytes(static_cast<double>(o.load.staging_budget)).c_str(), st.slots_used, st.slots);
  }
  return 0;
} catch (const std::exception& e) {
  return sluice_cli::fail(e.what());
}
