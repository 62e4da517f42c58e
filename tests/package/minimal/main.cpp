// The obvious use of the package: <sluice/sluice.hpp>, sluice::sluice, load().
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

#include <sluice/sluice.hpp>

int main(int, char** argv) {
  const std::filesystem::path dir = argv[1];
  std::vector<std::byte> bytes(64, std::byte{7});
  sluice::format::writer w;
  w.add("a", sluice::format::dtype::F32, {4, 4}, bytes).add("b", sluice::format::dtype::U8, {3}, std::span(bytes).first(3));
  w.write(dir / "model.safetensors");
  sluice::digest_sink sink;
  const auto st = sluice::load(sluice::checkpoint::open(dir), sink);
  std::printf("minimal: loaded %llu tensors, %llu bytes read\n", static_cast<unsigned long long>(st.tensors),
              static_cast<unsigned long long>(st.bytes_read));
  return st.tensors == 2 && sink.digests().size() == 2 ? 0 : 1;
}
