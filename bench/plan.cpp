// bench-plan: plan time and per-rank bytes for a 475 GiB-shaped checkpoint
// description. The generator's metadata mode builds the tensor list
// (DeepSeek-V3-like: 61 layers + the draft layer, 256 routed experts, hidden
// 7168, Engram-like tables to make up ~40% of the bytes) without writing data;
// then each topology is planned `--reps` times (best and median printed) and a
// table shows what each rank reads from storage and receives from its peers.
//
//   bench-plan [--size GIB] [--reps N] [--offload none|per-rank|shared-single|shared-cooperative]
//              [--topologies tp1,dp8,ep8:tp8:tp8,ep8:tp4,pp2]
//
// "kept": bytes the rank holds of the tensors it owns (its TP part of split
// tensors; shared tables not counted). "received" / "sent": bytes the window
// exchanges carry to / from it (load_plan::received_bytes, sent_bytes): each
// slice goes from its reader to the ranks that keep it and to no other, so a
// rank receives exactly what it keeps but did not read.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <sluice/policy/plan.hpp>
#include <sluice/testing/generator.hpp>

#include "common/args.hpp"

using namespace sluice;
namespace gen = sluice::testing;

namespace {
constexpr double gib = 1024.0 * 1024.0 * 1024.0;

std::uint64_t ordinary_bytes(const gen::checkpoint_layout& p) {
  std::uint64_t n = 0;
  for (const auto& t : p.tensors)
    if (t.name.find(".engram.") == std::string::npos || t.name.ends_with(".weight")) n += t.size;
  return n;
}

// DeepSeek-V3's shape; moe_intermediate and the Engram rows are solved so that
// ordinary tensors are ~60% and tables ~40% of `target` bytes.
gen::generator_options shape_for(std::uint64_t target) {
  gen::generator_options o;
  o.layers = 61, o.dense_layers = 3, o.experts = 256, o.shared_experts = 1;
  o.hidden = 7168, o.intermediate = 18432, o.vocab = 129280;
  o.engram_tables = 4, o.engram_dim = 7168, o.engram_rows = 16;
  o.draft = true, o.odd_tensors = false;
  o.max_shard_bytes = std::uint64_t{4} << 30;
  // ordinary(mi) is affine in the expert width: two samples solve it.
  o.moe_intermediate = 2048;
  const double a = static_cast<double>(ordinary_bytes(gen::make_layout(o)));
  o.moe_intermediate = 1024;
  const double b = static_cast<double>(ordinary_bytes(gen::make_layout(o)));
  const double want = 0.6 * static_cast<double>(target);
  const double mi = 1024 + (want - b) / (a - b) * 1024;
  // (a negative width, for a target below the shape's fixed part, is clamped before the cast)
  o.moe_intermediate = mi < 128 ? 128 : static_cast<std::uint64_t>(mi) / 128 * 128;
  const auto ord = ordinary_bytes(gen::make_layout(o));
  if (ord > target)
    throw config_error(fmt::format("--size {:.1f}: DeepSeek-V3's shape needs at least {:.1f} GiB (its attention, dense "
                                   "layers and embeddings alone, with the narrowest experts)",
                                   static_cast<double>(target) / gib, static_cast<double>(ord) / gib));
  const double per_row = static_cast<double>(o.engram_dim) + 4.0 * static_cast<double>((o.engram_dim + 127) / 128);
  if (target > ord)
    o.engram_rows = std::max<std::uint64_t>(16, static_cast<std::uint64_t>(static_cast<double>(target - ord) / o.engram_tables / per_row));
  return o;
}


std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const auto next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    at = next + 1;
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) try {
  double size_gib = 475;
  int reps = 3;
  std::string offload_s = "shared-cooperative", topologies_s = "tp1,dp8,ep8:tp8:tp8,ep8:tp4,pp2";
  CLI::App app("bench-plan: plan time and bytes read per rank for a DeepSeek-sized checkpoint (metadata only)");
  app.add_option("--size", size_gib, "checkpoint size in GiB")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "plans per topology (best of)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--offload", offload_s, "none|per-rank|shared-single|shared-cooperative")->capture_default_str();
  app.add_option("--topologies", topologies_s, "topologies, ':'-separated")->capture_default_str();
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  const auto offload = policy::parse_offload(offload_s);
  const auto topologies = split(topologies_s, ':');

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  const auto o = shape_for(static_cast<std::uint64_t>(size_gib * gib));
  const auto desc = gen::make_layout(o);
  const double gen_s = std::chrono::duration<double>(clock::now() - t0).count();
  std::vector<policy::tensor_info> tensors;
  tensors.reserve(desc.tensors.size());
  std::uint64_t total = 0;
  for (const auto& t : desc.tensors) {
    tensors.push_back({t.name, t.size, t.shape});
    total += t.size;
  }
  fmt::print("checkpoint description: {} tensors, {:.1f} GiB in {} shards ({} layers + draft, {} experts, hidden {}, "
             "moe_intermediate {}, {} Engram tables x {} rows); described in {:.2f} s\n",
             tensors.size(), static_cast<double>(total) / gib, desc.shards.size(), o.layers, o.experts, o.hidden,
             o.moe_intermediate, o.engram_tables, o.engram_rows, gen_s);
  fmt::print("offload {}, one node (local size = world), default plan_options; plan time = make_plan "
             "(classification included), best / median of {}\n\n",
             policy::offload_name(offload), reps);

  const auto cls = policy::classifier::deepseek();
  for (const auto& name : topologies) {
    const auto topo = policy::parse_topology(name);
    std::vector<double> secs;
    policy::load_plan p;
    for (int i = 0; i < reps; ++i) {
      auto copy = tensors;
      const auto a = clock::now();
      p = policy::make_plan(std::move(copy), cls, topo, offload);
      secs.push_back(std::chrono::duration<double>(clock::now() - a).count());
    }
    std::sort(secs.begin(), secs.end());
    std::vector<std::uint64_t> kept(p.world, 0);
    std::uint64_t split_rows = 0, split_columns = 0;
    for (const auto& e : p.entries) {
      if (e.shared()) continue;
      for (auto r : e.owners.members()) kept[r] += p.kept_bytes(e);
      split_rows += e.split == policy::tp_split::rows, split_columns += e.split == policy::tp_split::columns;
    }
    fmt::print("{} ({}): plan {:.3f} s best, {:.3f} s median; {} windows; read imbalance {:.3f}; shared segment {:.1f} GiB/node; "
               "TP split: {} by rows, {} by columns\n",
               name, p.topology_string(), secs.front(), secs[secs.size() / 2], p.windows, p.read_imbalance(),
               static_cast<double>(p.shared_bytes) / gib, split_rows, split_columns);
    fmt::print("  {:>4} {:>5} {:>10} {:>10} {:>12} {:>10}\n", "rank", "stage", "read GiB", "kept GiB", "received GiB", "sent GiB");
    for (std::size_t r = 0; r < p.world; ++r)
      fmt::print("  {:>4} {:>5} {:>10.2f} {:>10.2f} {:>12.2f} {:>10.2f}\n", r, p.pp_stage_of(static_cast<policy::rank_t>(r)),
                 static_cast<double>(p.read_bytes[r]) / gib, static_cast<double>(kept[r]) / gib,
                 static_cast<double>(p.received_bytes[r]) / gib, static_cast<double>(p.sent_bytes[r]) / gib);
    fmt::print("\n");
  }
  fmt::print("reproduce: {} --size {} --reps {} --offload {} --topologies {}\n", argv[0], size_gib, reps,
             policy::offload_name(offload), fmt::join(topologies, ":"));
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench-plan: " << e.what() << "\n";
  return 1;
}
