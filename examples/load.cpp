// sluice-load: load a checkpoint (a directory or one .safetensors file) with a
// live progress display and a summary. See --help. The command line is
// load_args.cpp's, the distributed load (with the S3 and NCCL parts)
// load_distributed.cpp's: units of their own (load_tool.hpp).

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
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/distributed/world.hpp>
#include <sluice/probe.hpp>
#include <sluice/sluice.hpp>

#include "common/cli.hpp"
#include "load_tool.hpp"

namespace {

using namespace sluice;
using sluice_cli::human_bytes;

using sluice_load::options;
using sluice_load::owned_digests;


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
      line += sluice_load::cache_progress();
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



}  // namespace

int main(int argc, char** argv) try {
  options o;
  if (auto rc = sluice_load::parse(o, argc, argv)) return *rc;
  const open_options oo = sluice_load::open_options_of(o);
  const double cpu0 = sluice_cli::cpu_seconds();
  if (o.probe) {
    // Metadata only: the plan and the contract from the headers; no tensor byte is read.
    // Opened through a catalog whose counter sees every byte the probe reads
    // (a single file: its directory's catalog; only that file is opened).
    // Its catalog's counters see every byte the probe reads (a single file:
    // its directory's catalog; only that file is opened).
    const auto probed = checkpoint::open(sluice_load::where_of(o), oo);
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
  if (!o.topology.empty() || std::getenv("WORLD_SIZE")) return sluice_load::run_distributed(o);
  // A one-process load's views are staging slots: holding them all would stall it.
  if (o.keep) return sluice_cli::fail("--keep holds a distributed load's tensors: use it with --topology");
  load_progress progress;
  o.load.progress = &progress;
  load_stats st;
  digest_sink digests;
  discard_sink discard;
  const auto opened = checkpoint::open(sluice_load::where_of(o), oo);
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
  if (auto cj = sluice_load::cache_json(); !cj.is_null()) j["cache"].update(cj);
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
    if (auto line = sluice_load::cache_summary(); !line.empty())
      std::fprintf(stderr, "%s\n", line.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  return sluice_cli::fail(e.what());
}
