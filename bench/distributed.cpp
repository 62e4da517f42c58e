// bench-distributed: figures of the distributed load.
//   1. aggregate GiB/s of a whole load for 1, 2, 4, 8 ranks (one node, Gloo over loopback);
//   2. the exchange's throughput vs one raw Gloo broadcast of the same bytes:
//      both are (bytes that travel) / (seconds of the collectives), where the
//      bytes that travel are the slices every reader sends to the ranks that
//      keep them (under DP, every other rank: the same bytes on the wire as a
//      broadcast), and the raw broadcast sends all of them from rank 0;
//      Besides the ratio of the two best times, the median over runs of the
//      ratio within one run (both measured by the same processes moments apart:
//      8 ranks on a few cores vary run to run more than the two differ);
//      And for a second load in the same processes with the window buffers
//      kept (`distributed_options::buffers`, as a weight reload would): its
//      exchange has no first touch of fresh pages, like the raw broadcast's
//      pre-faulted buffer;
//   3. with window reads overlapping the collectives and serial (the
//      `overlap` option; `automatic` picks serial on a machine with fewer than
//      two hardware threads per rank);
//   4. shared tables: cooperative vs single-reader load time.
// Hot page cache (the files are read once before timing). Prints the command line.
//
//   bench-distributed [--dir CKPT] [--size BYTES] [--ranks 1,2,4,8] [--window MIB] [--repeat 3]
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/gloo/communicator.hpp>
#include <sluice/distributed.hpp>
#include <sluice/testing/generator.hpp>

#include "../tests/comm/multiprocess.hpp"
#include "common/args.hpp"

using namespace sluice;
namespace fs = std::filesystem;

namespace {
struct counting_sink {
  std::uint64_t bytes = 0;
  bool accept(tensor_view v) {
    bytes += v.bytes.size();
    return true;
  }
};

void warm(const fs::path& dir) {
  std::vector<char> buf(8u << 20);
  for (auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {}
  }
}

// Runs n ranks of a distributed load; returns every rank's stats JSON (+ raw broadcast seconds).
std::vector<nlohmann::json> run(const fs::path& dir, std::size_t n, const std::string& offload, std::uint64_t window,
                                bool raw, distributed_options::overlap_mode overlap) {
  const auto store = sluice_test::fresh_dir("bench-store");
  const auto out = sluice_test::fresh_dir("bench-out");
  auto res = sluice_test::run_ranks(n, [&](std::size_t rank) {
    comm::rank_info who;
    who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n, who.store_dir = store.string();
    auto ck = checkpoint::open(dir);
    distributed_options o;
    o.load.staging_budget = 256u << 20;
    o.plan.window_bytes = window;
    o.plan.local_size = n;
    // This bench measures the exchange against the transport: every byte a
    // rank keeps but did not read travels over Gloo, as between nodes (on one
    // node the page cache would carry it: bench/node_copy.sh measures that).
    o.page_cache = false;
    o.overlap = overlap;
    o.buffers = std::make_shared<window_buffers>();
    const auto plan = plan_for(ck, fmt::format("tp1,dp{},ep{}", n, n), offload, o);
    counting_sink s;
    nlohmann::json j;
    if (n == 1) {
      comm::local c;
      j = load_distributed(ck, c, plan, s, o).to_json();
      j["reload"] = load_distributed(ck, c, plan, s, o).to_json();
    } else {
      comm::gloo c(who);
      c.barrier();
      j = load_distributed(ck, c, plan, s, o).to_json();
      c.barrier();
      j["reload"] = load_distributed(ck, c, plan, s, o).to_json();  // the same window buffers, already touched
      if (raw) {  // the same bytes in one raw Gloo broadcast from rank 0
        std::uint64_t total = 0;
        for (const auto& e : plan.entries)
          for (const auto& r : e.reads) total += r.exchanged ? r.size : 0;
        auto buf = lease::allocate(total);
        std::memset(buf.bytes().data(), 1, buf.bytes().size());  // pre-fault
        c.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        c.broadcast(buf.bytes(), 0);
        j["raw_broadcast_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        j["raw_broadcast_bytes"] = total;
        // and as one all-gather-v with the plan's per-rank contributions
        std::vector<std::size_t> counts(n, 0);
        for (const auto& e : plan.entries)
          for (const auto& r : e.reads) counts[r.reader] += r.exchanged ? r.size : 0;
        c.barrier();
        const auto t1 = std::chrono::steady_clock::now();
        c.all_gather_v(buf.bytes(), counts);
        j["raw_allgatherv_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      }
    }
    std::ofstream(out / fmt::format("rank{}.json", rank)) << j.dump();
    return 0;
  });
  std::vector<nlohmann::json> v;
  for (std::size_t r = 0; r < n; ++r) {
    if (res[r].code != 0) throw std::runtime_error(fmt::format("rank {} failed ({})", r, res[r].code));
    nlohmann::json j;
    std::ifstream(out / fmt::format("rank{}.json", r)) >> j;
    v.push_back(j);
  }
  fs::remove_all(store);
  fs::remove_all(out);
  return v;
}

double max_of(const std::vector<nlohmann::json>& v, const char* a, const char* b = nullptr) {
  double m = 0;
  for (auto& j : v) m = std::max(m, b ? j[a][b].get<double>() : j[a].get<double>());
  return m;
}
}  // namespace

int main(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  std::string dir_arg;
  std::uint64_t size = 512u << 20, window_mib = 64;
  int repeat = 3;
  std::vector<std::size_t> ranks{1, 2, 4, 8};
  CLI::App app("bench-distributed: whole distributed loads (Gloo over loopback) against a raw Gloo broadcast");
  app.add_option("--dir", dir_arg, "a checkpoint directory (default: one generated in a temporary directory)");
  app.add_option("--size", size, "bytes of the generated checkpoint")->capture_default_str();
  app.add_option("--window", window_mib, "window size in MiB")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "runs per row")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "rank counts, comma-separated")->delimiter(',')->capture_default_str();
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  fs::path dir = dir_arg;
  const std::uint64_t window = window_mib << 20;
  bool generated = false;
  if (dir.empty()) {
    dir = sluice_test::fresh_dir("bench-ckpt");
    testing::write_checkpoint(dir, testing::options_for_size(size));
    generated = true;
  }
  const auto bytes = static_cast<double>(checkpoint::open(dir).tensor_bytes());
  const double gib = 1024.0 * 1024 * 1024;
  warm(dir);
  fmt::print("# {}\n# checkpoint {} ({:.2f} GiB of tensors), window {} MiB, hot page cache\n", cmd, dir.string(),
             bytes / gib, window >> 20);
  fmt::print("\n| ranks | window reads | load s | aggregate GiB/s | exchange GiB/s | raw broadcast GiB/s | exchange / raw (best of each) "
             "| exchange / raw (median of per-run pairs) | reload s | reload: exchange / raw (median of pairs) | raw all-gather-v GiB/s | messages |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string breakdown = "\n| ranks (the fastest run) | window reads | setup s | tables s | read s (incl. tables) | exchange s | deliver s |\n|---|---|---|---|---|---|---|\n";
  using om = distributed_options::overlap_mode;
  for (auto n : ranks) {
    for (om mode : {om::off, om::on}) {
      if (n == 1 && mode == om::on) continue;  // nothing to overlap
      const char* label = mode == om::on ? "overlapped" : "serial";
      // Best of `repeat` runs, each figure on its own (8 processes on a few
      // cores measure the scheduler as much as the code: single runs vary 2x).
      std::vector<nlohmann::json> v;
      double secs = 1e30, xs = 1e30, rs = 1e30, ags = 1e30, travel = 0, rb = 0, msgs = 0;
      std::vector<double> paired;  // per run: raw broadcast seconds / exchange seconds (same processes, same moment)
      std::vector<double> paired_reload;  // the same for the second load (window buffers reused)
      double reload_secs = 1e30;
      for (int k = 0; k < repeat; ++k) {
        warm(dir);
        auto runk = run(dir, n, "shared-cooperative", window, n > 1, mode);
        if (max_of(runk, "seconds", "total") < secs) {
          secs = max_of(runk, "seconds", "total");
          v = runk;
        }
        double rx = 0, rt = 0;  // the reload: slowest rank's exchange and total
        for (auto& j : runk) rx = std::max(rx, j["reload"]["seconds"]["exchange"].get<double>()),
                             rt = std::max(rt, j["reload"]["seconds"]["total"].get<double>());
        reload_secs = std::min(reload_secs, rt);
        if (n == 1) continue;
        xs = std::min(xs, max_of(runk, "seconds", "exchange"));
        rs = std::min(rs, max_of(runk, "raw_broadcast_seconds"));
        paired.push_back(max_of(runk, "raw_broadcast_seconds") / max_of(runk, "seconds", "exchange"));
        paired_reload.push_back(max_of(runk, "raw_broadcast_seconds") / rx);
        msgs = 0;
        for (auto& j : runk) msgs += j["messages"].get<double>();
        ags = std::min(ags, max_of(runk, "raw_allgatherv_seconds"));
        rb = runk[0]["raw_broadcast_bytes"].get<double>();
        travel = rb;  // every slice that travels, once (it reaches every other rank)
      }
      std::string ex = "-", raw = "-", ratio = "-", agv = "-", med = "-", nm = "-", rmed = "-";
      const std::string rsecs = fmt::format("{:.3f}", reload_secs);
      if (n > 1 && !paired.empty()) {
        std::sort(paired.begin(), paired.end());
        med = fmt::format("{:.2f}", paired[paired.size() / 2]);
        std::sort(paired_reload.begin(), paired_reload.end());
        rmed = fmt::format("{:.2f}", paired_reload[paired_reload.size() / 2]);
        nm = fmt::format("{:.0f}", msgs / 2);  // each message counted at both ends
      }
      if (n > 1 && xs > 0) {
        ex = fmt::format("{:.2f}", travel / xs / gib);
        raw = fmt::format("{:.2f}", rb / rs / gib);
        ratio = fmt::format("{:.2f}", (travel / xs) / (rb / rs));
        agv = fmt::format("{:.2f}", rb / ags / gib);
      }
      fmt::print("| {} | {} | {:.3f} | {:.2f} | {} | {} | {} | {} | {} | {} | {} | {} |\n", n, label, secs, bytes / secs / gib, ex, raw, ratio,
                 med, rsecs, rmed, agv, nm);
      breakdown += fmt::format("| {} | {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} |\n", n, label, max_of(v, "seconds", "setup"),
                               max_of(v, "seconds", "tables"), max_of(v, "seconds", "read"), max_of(v, "seconds", "exchange"),
                               max_of(v, "seconds", "deliver"));
    }
  }
  fmt::print("{}", breakdown);
  const std::size_t n = ranks.back();
  fmt::print("\n| shared tables, {} ranks | table load s | segment GiB |\n|---|---|---|\n", n);
  for (const char* off : {"shared-single", "shared-cooperative"}) {
    warm(dir);
    auto v = run(dir, n, off, window, false, distributed_options::overlap_mode::automatic);
    fmt::print("| {} | {:.3f} | {:.2f} |\n", off, max_of(v, "seconds", "tables"), v[0]["shared_bytes"].get<double>() / gib);
  }
  if (generated) fs::remove_all(dir);
}
