// sluice-inspect PATH [--json]   (see --help)
// Opens a checkpoint directory (index + shards, or model.safetensors) or one
// .safetensors file, reading headers only, and reports its shards, tensors,
// bytes per dtype and per class, and the header bytes read.
// Errors: exit 1 and one stderr line "sluice: error: ..." naming the file, the
// tensor and the rule (a usage error: exit 2, one such line).
#include <array>
#include <iostream>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <sluice/checkpoint.hpp>

#include "common/args.hpp"

namespace {

// A deliberately simple, local classification by name pattern; the placement
// policies own the real one.
std::string_view classify(std::string_view name) {
  // ".mlp.experts.<digits>."
  constexpr std::string_view key = ".mlp.experts.";
  if (auto p = name.find(key); p != std::string_view::npos) {
    auto q = p + key.size();
    while (q < name.size() && name[q] >= '0' && name[q] <= '9') ++q;
    if (q > p + key.size() && q < name.size() && name[q] == '.') return "routed_expert";
  }
  if (name.find(".engram.") != std::string_view::npos && (name.ends_with(".table") || name.ends_with(".scale")))
    return "shared_table";
  return "replicated";
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app("sluice-inspect: report a checkpoint's shards, tensors, and bytes per dtype and per class,\n"
               "reading headers only.",
               "sluice-inspect");
  std::string path;
  bool json = false;
  app.add_option("PATH", path, "checkpoint directory (index + shards, or model.safetensors) or one .safetensors file")
      ->required();
  app.add_flag("--json", json, "print the report as JSON");
  if (auto rc = sluice_cli::parse_args(app, argc, argv, 2)) return *rc;
  const auto ckpt = sluice::checkpoint::open(std::filesystem::path(path));

  std::map<std::string, std::array<std::uint64_t, 2>> per_dtype, per_class;  // {tensors, bytes}
  std::vector<std::array<std::uint64_t, 2>> per_shard(ckpt.shards().size());
  for (const auto& t : ckpt.tensors()) {
    for (auto* m : {&per_dtype[std::string(sluice::format::name(t.type))], &per_class[std::string(classify(t.source_name))],
                    &per_shard[t.shard]}) {
      (*m)[0] += 1;
      (*m)[1] += t.size;
    }
  }

  if (json) {
    nlohmann::ordered_json j;
    j["location"] = ckpt.location();
    j["tensor_count"] = ckpt.tensors().size();
    j["tensor_bytes"] = ckpt.tensor_bytes();
    j["header_bytes_read"] = ckpt.header_bytes_read();
    auto table = [](const auto& m) {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, v] : m) o[k] = {{"tensors", v[0]}, {"bytes", v[1]}};
      return o;
    };
    j["dtypes"] = table(per_dtype);
    j["classes"] = table(per_class);
    j["shards"] = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < ckpt.shards().size(); ++i) {
      const auto& s = ckpt.shards()[i];
      j["shards"].push_back({{"name", s.name}, {"tensors", per_shard[i][0]}, {"tensor_bytes", per_shard[i][1]},
                             {"header_bytes", s.header.header_bytes()}, {"file_bytes", s.header.file_size}});
    }
    std::cout << j.dump(2) << '\n';
    return 0;
  }

  std::cout << fmt::format("{}: {} shards, {} tensors, {} tensor bytes, {} header bytes read\n", ckpt.location(),
                           ckpt.shards().size(), ckpt.tensors().size(), ckpt.tensor_bytes(), ckpt.header_bytes_read());
  std::cout << "by dtype:\n";
  for (const auto& [k, v] : per_dtype) std::cout << fmt::format("  {:<12} {:>8} tensors {:>16} bytes\n", k, v[0], v[1]);
  std::cout << "by class:\n";
  for (const auto& [k, v] : per_class) std::cout << fmt::format("  {:<14} {:>6} tensors {:>16} bytes\n", k, v[0], v[1]);
  std::cout << "shards:\n";
  for (std::size_t i = 0; i < ckpt.shards().size(); ++i) {
    const auto& s = ckpt.shards()[i];
    std::cout << fmt::format("  {:<40} {:>8} tensors {:>16} bytes {:>10} header bytes\n", sluice::printable(s.name), per_shard[i][0],
                             per_shard[i][1], s.header.header_bytes());
  }
  return 0;
} catch (const std::exception& e) {
  std::string msg = e.what();
  for (auto& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  std::cerr << "sluice: error: " << msg << '\n';
  return 1;
}
