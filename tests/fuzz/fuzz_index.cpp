// libFuzzer target: the sharded index parser and its verification against two
// fixed shard headers. Any input must parse or throw sluice::index_error; an
// accepted index either verifies or throws index_error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include <sluice/format/index.hpp>

namespace {

sluice::format::header make_shard(std::string file, std::initializer_list<std::pair<const char*, std::uint64_t>> tensors) {
  sluice::format::header h;
  h.file = std::move(file);
  std::uint64_t off = 0;
  for (auto [n, size] : tensors) {
    h.tensors.push_back({n, sluice::format::dtype::U8, {size}, off, off + size});
    off += size;
  }
  h.rebuild_lookup();
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice;
  static const auto s1 = make_shard("model-00001-of-00002.safetensors", {{"x", 8}});
  static const auto s2 = make_shard("model-00002-of-00002.safetensors", {{"y", 8}, {"z", 3}});
  static const std::map<std::string, const format::header*> headers{{s1.file, &s1}, {s2.file, &s2}};
  try {
    const auto ix = format::parse_index(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.index.json");
    for (const auto& [tensor, shard] : ix.weight_map)
      if (!format::is_plain_file_name(shard)) std::abort();  // parse must have rejected it
    try {
      format::verify(ix, headers);
    } catch (const index_error&) {
    }
    format::verify_options relaxed;
    relaxed.unindexed_tensor_is_error = false;
    relaxed.total_size_mismatch_is_error = false;
    relaxed.warn = [](const std::string&) {};
    try {
      format::verify(ix, headers, relaxed);
    } catch (const index_error& e) {
      if (e.rule() == "total-size") std::abort();  // relaxed: a warning, never an error
    }
  } catch (const index_error&) {
  }
  return 0;
}
