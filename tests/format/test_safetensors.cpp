#include <cstddef>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/format/safetensors.hpp>

#include "support/temp_dir.hpp"

using namespace sluice;
using namespace sluice::format;

namespace {

std::vector<std::byte> file_of(const std::string& json, std::size_t data_bytes) {
  return sluice_test::safetensors_file(json, data_bytes);
}

header parse(const std::string& json, std::size_t data_bytes) {
  const auto f = file_of(json, data_bytes);
  return parse_header(std::span<const std::byte>(f), f.size(), "mem.safetensors");
}

std::string rule_of(const std::string& json, std::size_t data_bytes) {
  try {
    (void)parse(json, data_bytes);
  } catch (const format_error& e) {
    return e.rule();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("a valid header parses into tensors in file order", "[format][safetensors]") {
  const auto h = parse(R"({"__metadata__":{"format":"pt"},)"
                       R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                       16);
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "a");  // sorted by offset, not by name or JSON order
  CHECK(h.tensors[1].name == "b");
  CHECK(h.tensors[1].type == dtype::BF16);
  CHECK(h.tensors[1].shape == std::vector<std::uint64_t>{2, 3});
  CHECK(h.tensors[1].size() == 12);
  CHECK(h.tensors[1].elements() == 6);
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.data_start() == h.header_bytes());
  CHECK(h.data_size() == 16);
  REQUIRE(h.find("b") != nullptr);
  CHECK(h.find("b")->begin == 4);
  CHECK(h.find("c") == nullptr);
}

TEST_CASE("a header right-padded with spaces is accepted", "[format][safetensors]") {
  const auto h = parse(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})" + std::string(5, ' '), 3);
  CHECK(h.tensors.size() == 1);
}

TEST_CASE("scalars, zero-size tensors and sub-byte types that fill whole bytes are accepted", "[format][safetensors]") {
  const auto h = parse(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                       R"("z":{"dtype":"BF16","shape":[0,7],"data_offsets":[4,4]},)"
                       R"("f4":{"dtype":"F4","shape":[2,3],"data_offsets":[4,7]},)"
                       R"("f6":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[7,10]}})",
                       10);
  CHECK(h.find("s")->size() == 4);
  CHECK(h.find("s")->elements() == 1);
  CHECK(h.find("z")->size() == 0);
  CHECK(h.find("f4")->size() == 3);
  CHECK(h.find("f6")->size() == 3);
}

TEST_CASE("an empty header with no data is a valid file", "[format][safetensors]") {
  CHECK(parse("{}", 0).tensors.empty());
  CHECK(parse(R"({"__metadata__":{}})", 0).tensors.empty());
}

TEST_CASE("a header whose length runs past the end of the file is rejected", "[format][safetensors]") {
  auto f = file_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  f[0] = std::byte{0xff};
  try {
    (void)parse_header(std::span<const std::byte>(f), f.size(), "x.safetensors");
    FAIL("accepted");
  } catch (const format_error& e) {
    CHECK(e.rule() == "header-length");
    CHECK(e.file() == "x.safetensors");
    CHECK(std::string(e.what()).find("x.safetensors") != std::string::npos);
  }
}

TEST_CASE("a header length above 100,000,000 bytes is rejected before anything is read", "[format][safetensors]") {
  std::vector<std::byte> first8(8);
  const std::uint64_t n = max_header_size + 1;
  for (int i = 0; i < 8; ++i) first8[static_cast<std::size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  CHECK_THROWS_AS(parse_header_length(first8, 1ull << 40, "big"), format_error);
  const std::uint64_t ok = max_header_size;
  for (int i = 0; i < 8; ++i) first8[static_cast<std::size_t>(i)] = static_cast<std::byte>(ok >> (8 * i));
  CHECK(parse_header_length(first8, 1ull << 40, "big") == max_header_size);
}

TEST_CASE("a file shorter than the 8-byte length is rejected", "[format][safetensors]") {
  std::vector<std::byte> f(5);
  CHECK_THROWS_AS(parse_header(std::span<const std::byte>(f), f.size(), "short"), format_error);
}

TEST_CASE("each broken rule is reported by its rule id", "[format][safetensors]") {
  CHECK(rule_of(R"(["a"])", 0) == "header-json");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})" "\n", 1) == "header-json");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2) ==
        "duplicate-name");
  CHECK(rule_of(R"({"__metadata__":{"k":["v"]}})", 0) == "metadata");
  CHECK(rule_of(R"({"a":{"dtype":"X9","shape":[1],"data_offsets":[0,1]}})", 1) == "dtype");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1) == "shape");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1) == "shape");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1) == "data-offsets");
  CHECK(rule_of(R"({"a":{"dtype":"U16","shape":[1],"data_offsets":[0,1]}})", 1) == "tensor-size");
  CHECK(rule_of(R"({"a":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", 1) == "tensor-size");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[18446744073709551615,2],"data_offsets":[0,1]}})", 1) == "tensor-size");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3) ==
        "layout");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4) ==
        "layout");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 2) == "data-end");
  CHECK(rule_of(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 2) == "data-end");
}

TEST_CASE("a data-end error names the last tensor and the missing byte range", "[format][safetensors]") {
  try {
    (void)parse(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[6],"data_offsets":[2,8]}})", 5);
    FAIL("accepted");
  } catch (const format_error& e) {
    CHECK(e.rule() == "data-end");
    CHECK(e.tensor() == "b");
    REQUIRE(e.range().has_value());
    CHECK(e.range()->size() == 3);
  }
}
