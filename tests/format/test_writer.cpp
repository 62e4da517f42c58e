#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/format/safetensors.hpp>
#include <sluice/format/writer.hpp>

#include "support/temp_dir.hpp"

using namespace sluice;
using namespace sluice::format;
using sluice_test::read_file;
using sluice_test::temp_dir;

namespace {
header parse_file(const std::filesystem::path& p) {
  const auto bytes = read_file(p);
  return parse_header(std::span<const std::byte>(bytes), bytes.size(), p.string());
}
}  // namespace

TEST_CASE("a written file parses back with the same tensors, bytes and metadata", "[format][writer]") {
  temp_dir dir;
  std::vector<std::byte> a(12);
  std::iota(reinterpret_cast<unsigned char*>(a.data()), reinterpret_cast<unsigned char*>(a.data()) + a.size(), 1);
  writer w;
  w.metadata("format", "pt")
      .add("a", dtype::F32, {3}, a)
      .add("b", dtype::BOOL, {5}, [](std::uint64_t off, std::span<std::byte> out) {
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(100 + off + i);
      })
      .add("s", dtype::I64, {}, std::vector<std::byte>(8, std::byte{7}))
      .add("z", dtype::BF16, {0, 4}, std::span<const std::byte>{});
  CHECK(w.data_size() == 12 + 5 + 8);
  w.write(dir.path() / "x.safetensors", 2);  // tiny chunks: fills are called per chunk

  const auto h = parse_file(dir.path() / "x.safetensors");
  REQUIRE(h.tensors.size() == 4);
  // A default-constructed writer aligns the data section to 8 bytes, so the
  // first tensor's bytes start at an 8-byte file offset.
  CHECK(h.data_start() % 8 == 0);
  CHECK((h.data_start() + h.find("a")->begin) % 8 == 0);
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.find("a")->begin == 0);
  CHECK(h.find("b")->begin == 12);
  CHECK(h.find("s")->shape.empty());
  CHECK(h.find("z")->size() == 0);
  const auto bytes = read_file(dir.path() / "x.safetensors");
  CHECK(std::memcmp(bytes.data() + h.data_start(), a.data(), a.size()) == 0);
  for (std::size_t i = 0; i < 5; ++i) CHECK(bytes[h.data_start() + 12 + i] == static_cast<std::byte>(100 + i));
  CHECK(bytes[h.data_start() + 17] == std::byte{7});
}

TEST_CASE("the data section starts at a multiple of the alignment, 8 by default", "[format][writer]") {
  temp_dir dir;
  for (std::uint64_t align : {8u, 64u, 4096u}) {
    writer w(align);
    w.add("t", dtype::U8, {3}, std::vector<std::byte>(3));
    w.write(dir.path() / "a.safetensors");
    const auto h = parse_file(dir.path() / "a.safetensors");
    CHECK(h.data_start() % align == 0);
    CHECK(w.header_json().size() + 8 == h.data_start());
  }
}

TEST_CASE("a default-constructed writer pads the header to 8 bytes whatever the JSON's length", "[format][writer]") {
  temp_dir dir;
  // Names of 1..8 characters give unpadded headers of eight different lengths
  // mod 8: at most one of them could be aligned without the padding.
  std::set<std::uint64_t> unpadded_mod8;
  for (std::size_t len = 1; len <= 8; ++len) {
    writer w;
    const std::string name(len, 'n');
    w.add(name, dtype::U8, {3}, std::vector<std::byte>(3, std::byte{9}));
    w.write(dir.path() / "d.safetensors");
    const auto bytes = read_file(dir.path() / "d.safetensors");
    const auto h = parse_file(dir.path() / "d.safetensors");
    CAPTURE(len, w.header_json());
    std::string json = w.header_json();
    unpadded_mod8.insert((8 + json.erase(json.find_last_not_of(' ') + 1).size()) % 8);
    CHECK(h.data_start() % 8 == 0);
    REQUIRE(h.find(name) != nullptr);
    const auto at = h.data_start() + h.find(name)->begin;   // the tensor's offset in the file
    CHECK(at % 8 == 0);
    REQUIRE(bytes.size() == at + 3);
    CHECK(bytes[at] == std::byte{9});
  }
  CHECK(unpadded_mod8.size() == 8);
}

TEST_CASE("the writer refuses tensors a reader would reject", "[format][writer]") {
  writer w;
  w.add("t", dtype::U8, {1}, std::vector<std::byte>(1));
  CHECK_THROWS_AS(w.add("t", dtype::U8, {1}, std::vector<std::byte>(1)), config_error);
  CHECK_THROWS_AS(w.add("f4", dtype::F4, {3}, fill_function{}), config_error);
  CHECK_THROWS_AS(w.add("huge", dtype::U8, {1ull << 32, 1ull << 32}, fill_function{}), config_error);
  CHECK_THROWS_AS(w.add("__metadata__", dtype::U8, {0}, fill_function{}), config_error);
  CHECK_NOTHROW(w.add("f4ok", dtype::F4, {4}, fill_function{}));
}

TEST_CASE("writing into a missing directory is an io_error naming the file", "[format][writer]") {
  writer w;
  w.add("t", dtype::U8, {1}, std::vector<std::byte>(1));
  try {
    w.write("/nonexistent-dir-sluice/x.safetensors");
    FAIL("wrote");
  } catch (const io_error& e) {
    CHECK(e.file() == "/nonexistent-dir-sluice/x.safetensors");
  }
}
