#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/format/index.hpp>

using namespace sluice;
using namespace sluice::format;

namespace {

header shard_with(std::string file, std::vector<std::pair<std::string, std::uint64_t>> tensors) {
  header h;
  h.file = std::move(file);
  std::uint64_t off = 0;
  for (auto& [n, size] : tensors) {
    h.tensors.push_back({n, dtype::U8, {size}, off, off + size});
    off += size;
  }
  h.rebuild_lookup();
  return h;
}

std::string rule_of(auto&& f) {
  try {
    f();
  } catch (const index_error& e) {
    return e.rule();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("an index maps tensors to shards and carries total_size", "[format][index]") {
  const auto ix = parse_index(R"({"metadata":{"total_size":30},"weight_map":{"a":"s1","b":"s2","c":"s1"}})", "ix.json");
  CHECK(ix.weight_map.size() == 3);
  CHECK(ix.total_size == 30u);
  CHECK(ix.shards() == std::vector<std::string>{"s1", "s2"});
  CHECK(first_tensor_in(ix, "s1") == "a");
}

TEST_CASE("total_size may be a number or a string of digits, and may be absent", "[format][index]") {
  CHECK(parse_index(R"({"metadata":{"total_size":"42"},"weight_map":{}})", "i").total_size == 42u);
  CHECK(parse_index(R"({"metadata":{"total_size":42.0},"weight_map":{}})", "i").total_size == 42u);
  CHECK_FALSE(parse_index(R"({"weight_map":{}})", "i").total_size.has_value());
  CHECK_FALSE(parse_index(R"({"metadata":null,"weight_map":{}})", "i").total_size.has_value());
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":-1},"weight_map":{}})", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":"1e3"},"weight_map":{}})", "i"); }) == "index-json");
  // Out of uint64's range: an index_error, not undefined behaviour or std::out_of_range (found by fuzz_index).
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":2184467440737095516157},"weight_map":{}})", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":18446744073709551616.0},"weight_map":{}})", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":"99999999999999999999999"},"weight_map":{}})", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":"+5"},"weight_map":{}})", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"metadata":{"total_size":1.5},"weight_map":{}})", "i"); }) == "index-json");
  CHECK(parse_index(R"({"metadata":{"total_size":"18446744073709551615"},"weight_map":{}})", "i").total_size == 18446744073709551615u);
}

TEST_CASE("a shard name must be a plain file name inside the checkpoint", "[format][index]") {
  CHECK(is_plain_file_name("model-00001-of-00002.safetensors"));
  CHECK(is_plain_file_name("..hidden"));
  CHECK_FALSE(is_plain_file_name(""));
  CHECK_FALSE(is_plain_file_name("."));
  CHECK_FALSE(is_plain_file_name(".."));
  CHECK_FALSE(is_plain_file_name("a/b"));
  CHECK_FALSE(is_plain_file_name("/etc/passwd"));
  CHECK_FALSE(is_plain_file_name("..\\x"));
  CHECK_FALSE(is_plain_file_name(std::string_view("a\0b", 3)));
  try {
    (void)parse_index(R"({"weight_map":{"w":"../elsewhere.safetensors"}})", "ix.json");
    FAIL("accepted");
  } catch (const index_error& e) {
    CHECK(e.rule() == "shard-name");
    CHECK(e.file() == "ix.json");
    CHECK(e.tensor() == "w");
  }
}

TEST_CASE("an index that is not a JSON object with a weight_map is rejected", "[format][index]") {
  CHECK(rule_of([] { (void)parse_index("{", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index("[]", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"weight_map":[]})", "i"); }) == "index-json");
  CHECK(rule_of([] { (void)parse_index(R"({"weight_map":{"a":3}})", "i"); }) == "index-json");
}

TEST_CASE("a weight_map value that is not a string is index-json naming its tensor, whatever its shape", "[format][index]") {
  // The entries are parsed as events, not as a DOM: a value of any shape is
  // refused, whatever it nests, and the tensor named is the first by name.
  for (const std::string bad : {R"(3)", R"(null)", R"(true)", R"(1.5)", R"([])", R"(["s"])", R"({})",
                                R"({"weight_map":{"x":"s"}})", R"([{"a":[1,{"b":"s"}]}])"}) {
    CAPTURE(bad);
    try {
      (void)parse_index(R"({"weight_map":{"z":"s","b":)" + bad + R"(,"a":"s","c":)" + bad + "}}", "ix.json");
      FAIL("accepted");
    } catch (const index_error& e) {
      CHECK(e.rule() == "index-json");
      CHECK(e.tensor() == "b");
      CHECK(std::string(e.what()).find("weight_map value is not a string") != std::string::npos);
    }
  }
  // A bad shard name and a non-string value: the first by name is reported.
  try {
    (void)parse_index(R"({"weight_map":{"m":7,"k":"../s"}})", "ix.json");
    FAIL("accepted");
  } catch (const index_error& e) {
    CHECK(e.rule() == "shard-name");
    CHECK(e.tensor() == "k");
  }
}

TEST_CASE("an index with two weight_map objects is index-json, and one nested elsewhere is not a weight_map", "[format][index]") {
  CHECK(rule_of([] { (void)parse_index(R"({"weight_map":{"a":"s"},"weight_map":{"b":"s"}})", "i"); }) == "index-json");
  // Listed in both: the duplicate is named first, as before.
  CHECK(rule_of([] { (void)parse_index(R"({"weight_map":{"a":"s"},"weight_map":{"a":"s"}})", "i"); }) == "duplicate-name");
  // "weight_map" inside metadata, or another top-level object, is not the map.
  const auto ix = parse_index(
      R"({"metadata":{"weight_map":{"no":"x"},"total_size":3},"other":{"weight_map":[1]},"weight_map":{"b":"s2","a":"s1"}})", "i");
  CHECK(ix.weight_map == std::map<std::string, std::string>{{"a", "s1"}, {"b", "s2"}});
  CHECK(ix.total_size == 3u);
  // The metadata after the weight_map reads the same.
  const auto after = parse_index(R"({"weight_map":{"a":"s1"},"metadata":{"total_size":"7","shards":{"s1":{"size":9}}}})", "i");
  CHECK(after.total_size == 7u);
  CHECK(after.shard_records.at("s1").size == 9u);
  CHECK(after.weight_map.size() == 1);
}

TEST_CASE("verification accepts an index that agrees with its shards", "[format][index]") {
  const auto s1 = shard_with("d/s1", {{"a", 10}, {"c", 5}});
  const auto s2 = shard_with("d/s2", {{"b", 15}});
  const auto ix = parse_index(R"({"metadata":{"total_size":30},"weight_map":{"a":"s1","b":"s2","c":"s1"}})", "d/ix");
  CHECK_NOTHROW(verify(ix, {{"s1", &s1}, {"s2", &s2}}));
}

TEST_CASE("verification reports each disagreement with the shards", "[format][index]") {
  const auto s1 = shard_with("d/s1", {{"a", 10}, {"c", 5}});
  const auto s2 = shard_with("d/s2", {{"b", 15}});
  const std::map<std::string, const header*> both{{"s1", &s1}, {"s2", &s2}};

  SECTION("a shard the index names is missing") {
    const auto ix = parse_index(R"({"weight_map":{"a":"s1","b":"s2","c":"s1","d":"s3"}})", "d/ix");
    try {
      verify(ix, both);
      FAIL("accepted");
    } catch (const index_error& e) {
      CHECK(e.rule() == "missing-shard");
      CHECK(e.file() == "d/ix");
      CHECK(e.tensor() == "d");
    }
  }
  SECTION("a tensor the index names is not in its shard") {
    const auto ix = parse_index(R"({"weight_map":{"a":"s1","b":"s2","c":"s1","x":"s2"}})", "d/ix");
    try {
      verify(ix, both);
      FAIL("accepted");
    } catch (const index_error& e) {
      CHECK(e.rule() == "missing-tensor");
      CHECK(e.file() == "d/s2");
      CHECK(e.tensor() == "x");
    }
  }
  SECTION("a shard holds a tensor the index omits: an error, or a warning by option") {
    const auto ix = parse_index(R"({"metadata":{"total_size":30},"weight_map":{"a":"s1","b":"s2"}})", "d/ix");
    try {
      verify(ix, both);
      FAIL("accepted");
    } catch (const index_error& e) {
      CHECK(e.rule() == "unindexed-tensor");
      CHECK(e.file() == "d/s1");
      CHECK(e.tensor() == "c");
    }
    std::vector<std::string> warnings;
    verify_options relaxed;
    relaxed.unindexed_tensor_is_error = false;
    relaxed.warn = [&](const std::string& w) { warnings.push_back(w); };
    CHECK_NOTHROW(verify(ix, both, relaxed));
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("'c'") != std::string::npos);
  }
  SECTION("total_size disagrees: an error, or a warning by option") {
    const auto ix = parse_index(R"({"metadata":{"total_size":31},"weight_map":{"a":"s1","b":"s2","c":"s1"}})", "d/ix");
    CHECK(rule_of([&] { verify(ix, both); }) == "total-size");
    std::vector<std::string> warnings;
    verify_options relaxed;
    relaxed.total_size_mismatch_is_error = false;
    relaxed.warn = [&](const std::string& w) { warnings.push_back(w); };
    CHECK_NOTHROW(verify(ix, both, relaxed));
    CHECK(warnings.size() == 1);
  }
}
