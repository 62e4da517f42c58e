// format/name_pattern.hpp: RE2 for user patterns, by hand for LITERAL(\d+)LITERAL,
// the same answers either way; names of any length in linear time.
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include <sluice/error.hpp>
#include <sluice/format/name_pattern.hpp>

using namespace sluice;
using format::name_pattern;

TEST_CASE("the layer and expert rules are matched by hand, the rest by RE2", "[format][name_pattern]") {
  CHECK(name_pattern(R"(layers\.(\d+)\.)").hand_parsed());
  CHECK(name_pattern(R"(mlp\.experts\.(\d+)\.)").hand_parsed());
  CHECK(name_pattern(R"(blocks_(\d+)_)").hand_parsed());
  CHECK_FALSE(name_pattern(R"(^layers\.(\d+)\.)").hand_parsed());
  CHECK_FALSE(name_pattern(R"((q_proj|k_proj)\.weight$)").hand_parsed());
  CHECK_FALSE(name_pattern(R"(x(\d+)5)").hand_parsed());   // a suffix starting with a digit: RE2's greedy \d+ decides
  CHECK(name_pattern().empty());
  CHECK_FALSE(name_pattern().search("anything"));
}

TEST_CASE("a hand-parsed rule finds the leftmost match, as the regular expression does", "[format][name_pattern]") {
  const name_pattern layer(R"(layers\.(\d+)\.)");
  CHECK(layer.group("model.layers.12.mlp.weight") == "12");
  CHECK(layer.group("model.layers.x.layers.7.w") == "7");      // the first occurrence has no number
  CHECK(layer.group("model.layers.12") == std::nullopt);        // no dot after the number
  CHECK(layer.group("xlayers.3.w") == "3");                      // searched, not anchored
  CHECK(layer.group("layers..w") == std::nullopt);
  CHECK(layer.group("model.layers.3.layers.4.") == "3");
}

TEST_CASE("hand-parsed and RE2 matching agree on random names", "[format][name_pattern]") {
  // The same rule twice: by hand, and forced through RE2 by a no-op group around the prefix.
  const name_pattern hand(R"(experts\.(\d+)\.)"), re2(R"((?:experts)\.(\d+)\.)");
  REQUIRE(hand.hand_parsed());
  REQUIRE_FALSE(re2.hand_parsed());
  std::mt19937 rng(7);
  const std::string parts[] = {"experts", ".", "1", "23", "x", "experts.", "9.", "..", "model", "0"};
  for (int i = 0; i < 20000; ++i) {
    std::string name;
    const int n = static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) name += parts[rng() % std::size(parts)];
    INFO(name);
    CHECK(hand.search(name) == re2.search(name));
    CHECK(hand.group(name) == re2.group(name));
  }
}

TEST_CASE("names of 400,000 bytes match in linear time without recursion", "[format][name_pattern]") {
  const std::string name = "model.layers." + std::string(200'000, '7') + ".mlp.experts." + std::string(200'000, '3') + ".w";
  CHECK(name_pattern(R"(layers\.(\d+)\.)").group(name)->size() == 200'000);
  CHECK(name_pattern(R"(experts\.(\d+)\.w$)").group(name)->size() == 200'000);   // RE2
  CHECK(name_pattern(R"((\d+)+x)").search(name) == false);                       // catastrophic for a backtracker
}

TEST_CASE("an invalid pattern is a config_error naming it and RE2's reason", "[format][name_pattern]") {
  try {
    (void)name_pattern("(unclosed");
    FAIL("accepted");
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("(unclosed") && Catch::Contains("not a valid regular expression (RE2 syntax)"));
  }
  CHECK_THROWS_AS(name_pattern(R"((?=lookahead))"), config_error);   // not RE2
  const auto select = format::matching(R"(^model\.(embed|norm))");
  CHECK(select("model.embed_tokens.weight"));
  CHECK_FALSE(select("lm_head.weight"));
}
