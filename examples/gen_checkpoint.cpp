// gen-checkpoint DIR [--size 2GiB] [--layers N] [--experts E] [--hidden H]
//                    [--engram-tables T] [--engram-rows R] [--shard-size 512MiB]
//                    [--no-draft] [--vl-prefix] [--seed S] [--plan-only]
//                    [--digests FILE]   (name, dtype, shape, sha256 per tensor; see --help)
// Writes a deterministic DeepSeek-like sharded checkpoint (see
// sluice/testing/generator.hpp) and prints what it wrote. Reusing an existing
// checkpoint is the caller's business: this always (re)writes.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <sluice/core/size.hpp>
#include <sluice/testing/generator.hpp>

#include "common/args.hpp"

using sluice::parse_size;  // the library's one size grammar (sluice/core/size.hpp)

int main(int argc, char** argv) try {
  namespace t = sluice::testing;
  CLI::App app("gen-checkpoint: write a deterministic DeepSeek-like sharded checkpoint and print what it wrote.\n"
               "--size and --seed set the base; the other options override it.",
               "gen-checkpoint");
  app.get_formatter()->column_width(26);
  std::string dir, size, shard_size, digests;
  std::uint64_t seed = 1;
  std::optional<std::uint32_t> layers, dense_layers, experts, engram_tables;
  std::optional<std::uint64_t> hidden, engram_rows;
  bool no_draft = false, vl_prefix = false, plan_only = false;
  // An option that, when given, overrides the generator's value.
  const auto override_of = [&app](const char* name, auto& into, const char* what) {
    using value = typename std::remove_reference_t<decltype(into)>::value_type;
    app.add_option_function<value>(name, [&into](const value& v) { into = v; }, what)->type_name("N");
  };
  app.add_option("DIR", dir, "where to write the checkpoint (always rewritten)")->required();
  app.add_option("--size", size, "about this many tensor bytes, e.g. 2GiB (default: the generator's small model)")
      ->type_name("SIZE");
  override_of("--layers", layers, "decoder layers");
  override_of("--dense-layers", dense_layers, "leading layers with a dense MLP");
  override_of("--experts", experts, "routed experts per MoE layer");
  override_of("--hidden", hidden, "model width");
  override_of("--engram-tables", engram_tables, "Engram-like tables, one shard each");
  override_of("--engram-rows", engram_rows, "rows per Engram table");
  app.add_option("--shard-size", shard_size, "cut ordinary shards at about this size, e.g. 512MiB")->type_name("SIZE");
  app.add_flag("--no-draft", no_draft, "no draft (MTP) module");
  app.add_flag("--vl-prefix", vl_prefix, "name tensors model.language_model.* instead of model.*");
  app.add_option("--seed", seed, "seed of the tensor contents (default 1)")->type_name("S");
  app.add_flag("--plan-only", plan_only, "print the plan, write nothing");
  app.add_option("--digests", digests, "write name, dtype, shape, sha256 per tensor to FILE")->type_name("FILE");
  if (auto rc = sluice_cli::parse_args(app, argc, argv, 2)) return *rc;

  t::generator_options o;
  if (!size.empty()) o = t::options_for_size(parse_size(size), seed);
  o.seed = seed;
  if (layers) o.layers = *layers;
  if (dense_layers) o.dense_layers = *dense_layers;
  if (experts) o.experts = *experts;
  if (hidden) o.hidden = *hidden;
  if (engram_tables) o.engram_tables = *engram_tables;
  if (engram_rows) o.engram_rows = *engram_rows;
  if (!shard_size.empty()) o.max_shard_bytes = parse_size(shard_size);
  if (no_draft) o.draft = false;
  if (vl_prefix) o.vl_prefix = true;
  const auto plan = t::make_layout(o);
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
