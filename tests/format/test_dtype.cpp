#include <set>
#include <string>

#include <catch2/catch.hpp>

#include <sluice/format/dtype.hpp>

using namespace sluice::format;

TEST_CASE("every dtype the safetensors reference lists is known, by its header name", "[format][dtype]") {
  const char* reference[] = {"BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",   "F8_E5M2", "F8_E4M3",
                             "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16",
                             "I32", "U32", "F32", "C64", "F64", "I64", "U64"};
  CHECK(dtype_count == std::size(reference));
  std::set<std::string> seen;
  for (const char* n : reference) {
    auto t = parse_dtype(n);
    REQUIRE(t.has_value());
    CHECK(name(*t) == n);
    seen.insert(std::string(name(*t)));
  }
  CHECK(seen.size() == dtype_count);
}

TEST_CASE("dtype sizes are in bits, sub-byte types included", "[format][dtype]") {
  STATIC_REQUIRE(bits(dtype::F4) == 4);
  STATIC_REQUIRE(bits(dtype::F6_E2M3) == 6);
  STATIC_REQUIRE(bits(dtype::F6_E3M2) == 6);
  STATIC_REQUIRE(bits(dtype::BOOL) == 8);
  STATIC_REQUIRE(bits(dtype::F8_E4M3) == 8);
  STATIC_REQUIRE(bits(dtype::F8_E8M0) == 8);
  STATIC_REQUIRE(bits(dtype::BF16) == 16);
  STATIC_REQUIRE(bits(dtype::F32) == 32);
  STATIC_REQUIRE(bits(dtype::C64) == 64);
  STATIC_REQUIRE(bits(dtype::I64) == 64);
}

TEST_CASE("an unknown or differently spelled dtype is not parsed", "[format][dtype]") {
  CHECK_FALSE(parse_dtype("F7").has_value());
  CHECK_FALSE(parse_dtype("bf16").has_value());
  CHECK_FALSE(parse_dtype("").has_value());
  CHECK_FALSE(parse_dtype("BF16 ").has_value());
  STATIC_REQUIRE(parse_dtype("F8_E4M3") == dtype::F8_E4M3);
}
