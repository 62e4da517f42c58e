// bench-reload: the memory of a reload under distribution, per rank.
//   N ranks (Gloo over loopback), TP1/DPN/EPN, shared tables (cooperative
//   offload), placeholders. Each rank records its load contract during the
//   distributed initial load, with a loader that declines the routed experts
//   it does not own; then reloads an update (the same layout, another seed)
//   through a manifest::reload_session behind a testing::reload_meter, twice:
//   1. distributed: the update read once across the ranks (the other ranks'
//      experts arrive as placeholders);
//   2. whole: the update read by every rank on its own, every tensor offered
//      (as a trainer sending every tensor to every rank would).
//   Prints, per rank and mode: the rank's contract bytes, the peak bytes the
//   session buffered, its share of the incomplete layers at that moment (the
//   bound: the contract bytes of the layers that received a tensor and are
//   not yet published), the largest share over the update, the most the
//   buffer exceeded the share at any view (0: the bound held), and the
//   tensors declined on arrival.
//
//   bench-reload [--dir CKPT --update CKPT2 | --size BYTES] [--ranks 8] [--window MIB]
#include <algorithm>
#include <fstream>
#include <optional>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/distributed.hpp>
#include <sluice/gloo/communicator.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/manifest/reload.hpp>
#include <sluice/testing/generator.hpp>
#include <sluice/testing/reload_meter.hpp>

#include "../tests/comm/multiprocess.hpp"
#include "common/args.hpp"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

std::optional<std::int64_t> expert_of(const std::string& name) {
  static const std::regex re(R"(\.mlp\.experts\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, re)) return std::nullopt;
  return std::stoll(m[1].str());
}

// An EP rank's loader: declines the other ranks' experts (expert e on EP rank
// e * EP / experts, as the plan places it); applies nothing (the figure is
// the session's buffering, not the engine's copy).
struct ep_loader {
  std::size_t rank = 0, ep = 1;
  std::uint64_t experts = 1;
  bool operator()(tensor_view v, manifest::application_log& log) {
    const auto x = expert_of(v.name());
    if (x && static_cast<std::uint64_t>(*x) * ep / experts != rank) return false;
    manifest::selectors sel;
    if (x) sel.emplace("expert_id", *x);
    log.record(v.name(), std::move(sel));
    return true;
  }
};

template <class Session, class Meter>
nlohmann::json report(const Session& s, const Meter& m) {
  return {{"contract_bytes", m.contract_bytes()},   {"peak", s.stats().peak_buffered_bytes},
          {"share_at_peak", m.share_at_peak()},     {"max_share", m.max_share()},
          {"max_excess", m.max_excess()},           {"declined", s.stats().declined},
          {"published", s.stats().layers_published}, {"layers", s.expected().layers().size()}};
}

std::string mib(std::uint64_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1024.0 * 1024.0)); }

}  // namespace

int main(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  std::string dir_arg, update_arg;
  std::uint64_t size = 128u << 20, window_mib = 16;
  std::size_t n = 8;
  CLI::App app("bench-reload: peak reload buffer per rank against its share of the incomplete layers");
  app.add_option("--dir", dir_arg, "the initial checkpoint (default: one generated in a temporary directory)");
  app.add_option("--update", update_arg, "the update (with --dir; default: the generated layout with seed 2)");
  app.add_option("--size", size, "bytes of the generated checkpoints")->capture_default_str();
  app.add_option("--ranks", n, "ranks (TP1/DPn/EPn)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--window", window_mib, "window size in MiB")->capture_default_str()->check(CLI::PositiveNumber);
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  if (dir_arg.empty() != update_arg.empty()) {
    fmt::print(stderr, "bench-reload: error: --dir and --update go together\n");
    return 2;
  }
  fs::path dir = dir_arg, update = update_arg;
  std::optional<fs::path> generated;
  if (dir.empty()) {
    generated = sluice_test::fresh_dir("bench-reload");
    dir = *generated / "initial", update = *generated / "update";
    testing::write_checkpoint(dir, testing::options_for_size(size, 1));
    testing::write_checkpoint(update, testing::options_for_size(size, 2));
  }
  std::uint64_t experts = 0;
  {
    const auto ck = checkpoint::open(dir);
    for (const auto& t : ck.tensors())
      if (const auto x = expert_of(t.name)) experts = std::max<std::uint64_t>(experts, static_cast<std::uint64_t>(*x) + 1);
  }
  const auto topology = fmt::format("tp1,dp{},ep{}", n, n);
  const auto store = sluice_test::fresh_dir("bench-reload-store");
  const auto out = sluice_test::fresh_dir("bench-reload-out");
  const auto res = sluice_test::run_ranks(
      n,
      [&](std::size_t rank) {
        comm::rank_info who;
        who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n, who.store_dir = store.string();
        comm::gloo c(who);
        distributed_options o;
        o.load.staging_budget = 64u << 20;
        o.plan.window_bytes = window_mib << 20;
        o.plan.local_size = n;
        const ep_loader loader{rank, n, std::max<std::uint64_t>(experts, 1)};
        const auto ck = checkpoint::open(dir);
        manifest::recorder rec(loader);
        (void)load_distributed(ck, c, plan_for(ck, topology, "shared-cooperative", o), rec, o);
        const auto contract = rec.freeze();
        const auto up = checkpoint::open(update);
        nlohmann::json j;
        {
          manifest::reload_session s(contract, loader);
          testing::reload_meter m(s);
          (void)load_distributed(up, c, plan_for(up, topology, "shared-cooperative", o), m, o);
          j["distributed"] = report(s, m);
        }
        {
          manifest::reload_session s(contract, loader);
          testing::reload_meter m(s);
          (void)load(up, m, o.load);
          j["whole"] = report(s, m);
        }
        std::ofstream(out / fmt::format("rank{}.json", rank)) << j.dump();
        return 0;
      },
      std::chrono::seconds(600));
  std::vector<nlohmann::json> v;
  for (std::size_t r = 0; r < n; ++r) {
    if (res[r].code != 0) {
      fmt::print(stderr, "bench-reload: rank {} failed ({})\n", r, res[r].code);
      return 1;
    }
    nlohmann::json j;
    std::ifstream(out / fmt::format("rank{}.json", r)) >> j;
    v.push_back(std::move(j));
  }
  fs::remove_all(store);
  fs::remove_all(out);
  const auto ck = checkpoint::open(update);
  fmt::print("# {}\n# update {} ({} MiB of tensors, {} routed experts per layer), {}, shared-cooperative, window {} MiB\n",
             cmd, update.string(), mib(ck.tensor_bytes()), experts, topology, window_mib);
  for (const char* mode : {"distributed", "whole"}) {
    fmt::print("\n{}: {}\n\n| rank | contract MiB | peak buffered MiB | share at peak MiB | max share MiB | peak / share | max excess B | declined | layers published |\n"
               "|---|---|---|---|---|---|---|---|---|\n",
               mode, std::string(mode) == "distributed" ? "the update read once across the ranks (placeholders for the other ranks' experts)"
                                                         : "the update read whole by every rank (every expert offered)");
    for (std::size_t r = 0; r < n; ++r) {
      const auto& x = v[r][mode];
      const auto peak = x["peak"].get<std::uint64_t>(), share = x["share_at_peak"].get<std::uint64_t>();
      fmt::print("| {} | {} | {} | {} | {} | {:.3f} | {} | {} | {}/{} |\n", r, mib(x["contract_bytes"].get<std::uint64_t>()), mib(peak),
                 mib(share), mib(x["max_share"].get<std::uint64_t>()), share ? static_cast<double>(peak) / static_cast<double>(share) : 0.0,
                 x["max_excess"].get<std::uint64_t>(), x["declined"].get<std::uint64_t>(), x["published"].get<std::uint64_t>(),
                 x["layers"].get<std::uint64_t>());
    }
  }
  if (generated) fs::remove_all(*generated);
  return 0;
}
