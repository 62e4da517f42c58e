// error.hpp: every message is one line, whatever names and keys it quotes.
#include <string>

#include <catch2/catch.hpp>

#include <sluice/error.hpp>

using namespace sluice;

TEST_CASE("printable escapes control bytes and backslashes, and bounds the length", "[format][error]") {
  CHECK(printable("plain.name") == "plain.name");
  CHECK(printable("a\tb\nc\rd\\e") == R"(a\tb\nc\rd\\e)");
  CHECK(printable(std::string("x\0y\x7f", 4)) == R"(x\x00y\x7f)");
  CHECK(printable("a\\b", std::string_view::npos, false) == R"(a\b)");
  CHECK(printable(std::string(300, 'n'), 10) == "nnnnnnnnnn...(300 bytes)");
  // Cut at a character boundary: "é" is two bytes.
  CHECK(printable("ab\xc3\xa9", 3) == "ab...(4 bytes)");
}

TEST_CASE("an error naming a hostile tensor, file and detail stays one bounded line", "[format][error]") {
  const std::string name = "evil\tU8\t[1]\t0000\nmodel.norm.weight";
  const format_error e("layout", "the detail quotes it too: " + name + "\n", {"dir/\nfile", name, byte_range{0, 1}});
  const std::string what = e.what();
  CHECK(what.find('\n') == std::string::npos);
  CHECK(what.find('\t') == std::string::npos);
  CHECK_THAT(what, Catch::Contains(R"(tensor 'evil\tU8\t[1]\t0000\nmodel.norm.weight')"));
  CHECK(e.tensor() == name);   // the accessors keep the name as it is
  const error long_one(std::string(100'000, 'd'), {std::string(100'000, 'f'), std::string(100'000, 't')});
  CHECK(std::string(long_one.what()).size() < 10'000);
}
