// tests for <sluice/core/size.hpp>: the one size grammar of every front end
#include <catch2/catch.hpp>

#include <sluice/core/size.hpp>

using sluice::parse_size;

TEST_CASE("binary units are powers of 1024, decimal units powers of 1000", "[core][size]") {
  CHECK(parse_size("4GiB") == 4ull << 30);
  CHECK(parse_size("4G") == 4ull << 30);
  CHECK(parse_size("4g") == 4ull << 30);
  CHECK(parse_size("4GB") == 4'000'000'000ull);
  CHECK(parse_size("4gb") == 4'000'000'000ull);
  CHECK(parse_size("256MiB") == 256ull << 20);
  CHECK(parse_size("512k") == 512ull << 10);
  CHECK(parse_size("512KB") == 512'000ull);
  CHECK(parse_size("2TiB") == 2ull << 40);
  CHECK(parse_size("3TB") == 3'000'000'000'000ull);
  CHECK(parse_size("1048576") == 1048576);
  CHECK(parse_size("17B") == 17);
  CHECK(parse_size(" 8MiB ") == 8ull << 20);
}

TEST_CASE("a fraction is allowed and rounded down to a byte", "[core][size]") {
  CHECK(parse_size("1.5GiB") == 3ull << 29);
  CHECK(parse_size("0.5KiB") == 512);
  CHECK(parse_size("1.0001KB") == 1000);
}

TEST_CASE("anything else is a config_error naming the text", "[core][size]") {
  for (const char* bad : {"", "GiB", "-1GiB", "4XB", "4 G B", "0", "0.0001", "1e9", "99999999999999999999",
                          "17179869184GiB"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_size(bad), sluice::config_error);
  }
  CHECK_THROWS_WITH(parse_size("4XB"), Catch::Contains("size '4XB'") && Catch::Contains("unknown unit"));
}
