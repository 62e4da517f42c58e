// An engine-side program: `engine --write DIR` writes a small checkpoint;
// `engine DIR`, on each rank its launcher started (RANK, WORLD_SIZE, the
// store: comm::rank_info::from_env), loads DIR across the world under
// tp1,dp4,ep4 and checks what it was given: every replicated tensor, its own
// routed expert and no other expert's bytes, each byte as written.
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <sluice/distributed.hpp>
#include <sluice/sluice.hpp>

namespace {

std::byte expected(const std::string& name, std::uint64_t i) {
  std::uint64_t h = 0;
  for (char c : name) h = h * 131 + static_cast<unsigned char>(c);
  return static_cast<std::byte>((h + i * 7) & 0xff);
}

std::vector<std::string> names() {
  std::vector<std::string> n{"model.embed_tokens.weight", "model.norm.weight"};
  for (int e = 0; e < 4; ++e) n.push_back("model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj.weight");
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--write") {
    std::vector<std::vector<std::byte>> bytes;
    sluice::format::writer w;
    for (const auto& n : names()) {
      auto& b = bytes.emplace_back(4096);
      for (std::uint64_t i = 0; i < b.size(); ++i) b[i] = expected(n, i);
      w.add(n, sluice::format::dtype::U8, {64, 64}, b);
    }
    std::filesystem::create_directories(argv[2]);
    w.write(std::filesystem::path(argv[2]) / "model.safetensors");
    return 0;
  }
  const auto who = sluice::comm::rank_info::from_env();
  int carried = 0, wrong = 0, foreign = 0;
  auto loader = [&](sluice::tensor_view v) {
    if (!v.carries_data()) return;
    carried += v.last();
    const auto& n = v.name();
    const auto e = n.find("experts.");
    if (e != std::string::npos && std::stoul(n.substr(e + 8)) != who.rank) ++foreign;
    for (std::size_t i = 0; i < v.bytes.size(); ++i) wrong += v.bytes[i] != expected(n, v.offset + i);
  };
  sluice::callback_sink<decltype(loader)> sink(loader);
  const auto st = sluice::load_distributed(sluice::location(argv[1]), "tp1,dp4,ep4", "none", who, sink);
  const bool ok = who.world_size == 4 && st.world == 4 && carried == 3 && wrong == 0 && foreign == 0;
  std::printf("engine: rank %zu of %zu: %d tensors, %d wrong bytes, %d other ranks' experts: %s\n", who.rank,
              who.world_size, carried, wrong, foreign, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
