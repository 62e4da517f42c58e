// What an engine writes: open a checkpoint, load it through its weight loader.
#include <cstdio>
#include <filesystem>
#include <vector>

#include <sluice/sluice.hpp>

int main(int, char** argv) {
  const std::filesystem::path dir = argv[1];
  std::vector<std::byte> bytes(64, std::byte{7});
  sluice::format::writer w;
  w.add("a", sluice::format::dtype::F32, {4, 4}, bytes).add("b", sluice::format::dtype::U8, {3}, std::span(bytes).first(3));
  w.write(dir / "model.safetensors");
  auto ck = sluice::checkpoint::open(dir);
  int n = 0;
  auto loader = [&](sluice::tensor_view v) { n += v.whole(); };
  sluice::callback_sink<decltype(loader)> sink(loader);
  auto st = sluice::load(ck, sink);
  std::printf("consumer: loaded %d tensors, %llu bytes\n", n, static_cast<unsigned long long>(st.tensor_bytes));
  return n == 2 ? 0 : 1;
}
