// gen-checkpoint DIR [--size 2GiB] [--layers N] [--experts E] [--hidden H]
//                    [--engram-tables T] [--engram-rows R] [--shard-size 512MiB]
//                    [--no-draft] [--vl-prefix] [--seed S] [--plan-only]
//                    [--digests FILE]   (name, dtype, shape, sha256 per tensor)
// Writes a deterministic DeepSeek-like sharded checkpoint (see
// sluice/testing/generator.hpp) and prints what it wrote. Reusing an existing
// checkpoint is the caller's business: this always (re)writes.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

#include <sluice/testing/generator.hpp>

namespace {

std::uint64_t parse_size(std::string_view s) {
  std::size_t pos = 0;
  const double v = std::stod(std::string(s), &pos);
  const auto unit = s.substr(pos);
  double m = 1;
  if (unit == "K" || unit == "KiB") m = 1ull << 10;
  else if (unit == "M" || unit == "MiB") m = 1ull << 20;
  else if (unit == "G" || unit == "GiB") m = 1ull << 30;
  else if (unit == "T" || unit == "TiB") m = 1ull << 40;
  else if (!unit.empty() && unit != "B") throw sluice::config_error(fmt::format("bad size '{}' (use e.g. 512KiB, 2GiB)", s));
  if (v < 0) throw sluice::config_error(fmt::format("bad size '{}'", s));
  return static_cast<std::uint64_t>(v * m);
}

int usage() {
  std::cerr << "usage: gen-checkpoint DIR [--size 2GiB] [--layers N] [--experts E] [--hidden H]\n"
               "                      [--engram-tables T] [--engram-rows R] [--shard-size S]\n"
               "                      [--no-draft] [--vl-prefix] [--seed S] [--plan-only] [--digests FILE]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  namespace t = sluice::testing;
  if (argc < 2 || std::string_view(argv[1]).starts_with("-")) return usage();
  const std::string dir = argv[1];
  // First pass: --size and --seed set the base; the others override it.
  t::generator_options o;
  std::uint64_t seed = 1;
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string_view(argv[i]) == "--seed") seed = std::stoull(argv[i + 1]);
  }
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string_view(argv[i]) == "--size") o = t::options_for_size(parse_size(argv[i + 1]), seed);
  o.seed = seed;
  bool plan_only = false;
  std::string digests;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw sluice::config_error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--size" || a == "--seed") (void)value();
    else if (a == "--layers") o.layers = static_cast<std::uint32_t>(std::stoul(value()));
    else if (a == "--dense-layers") o.dense_layers = static_cast<std::uint32_t>(std::stoul(value()));
    else if (a == "--experts") o.experts = static_cast<std::uint32_t>(std::stoul(value()));
    else if (a == "--hidden") o.hidden = std::stoull(value());
    else if (a == "--engram-tables") o.engram_tables = static_cast<std::uint32_t>(std::stoul(value()));
    else if (a == "--engram-rows") o.engram_rows = std::stoull(value());
    else if (a == "--shard-size") o.max_shard_bytes = parse_size(value());
    else if (a == "--no-draft") o.draft = false;
    else if (a == "--vl-prefix") o.vl_prefix = true;
    else if (a == "--plan-only") plan_only = true;
    else if (a == "--digests") digests = value();
    else return usage();
  }
  const auto plan = t::make_plan(o);
  if (!plan_only) t::write_checkpoint(dir, plan);
  if (!digests.empty()) {
    std::ofstream f(digests, std::ios::trunc);
    for (const auto& e : t::expected_tensors(plan)) f << e.line() << '\n';
    if (!f.flush()) throw sluice::io_error("cannot write the digests", {digests});
  }
  std::cout << fmt::format("{} {}: {} shards, {} tensors, {} tensor bytes, {} file bytes, {} header bytes\n",
                           plan_only ? "planned" : "wrote", dir, plan.shards.size(), plan.tensors.size(),
                           plan.total_size, plan.file_bytes(), plan.header_bytes());
  std::cout << fmt::format("  layers {} (dense {}), experts {}, hidden {}, engram tables {} x {} rows, seed {}{}{}\n",
                           o.layers, o.dense_layers, o.experts, o.hidden, o.engram_tables, o.engram_rows, o.seed,
                           o.vl_prefix ? ", vl prefix" : "", o.draft ? ", draft module in 3 shards" : "");
  return 0;
} catch (const std::exception& e) {
  std::string msg = e.what();
  for (auto& c : msg)
    if (c == '\n') c = ' ';
  std::cerr << "sluice: error: " << msg << '\n';
  return 1;
}
