// The bad-input corpus (tests/data/bad/, written by tests/data/make_bad_corpus.py):
// every malformed file or checkpoint gives its typed error, with the rule, the
// file and the tensor named -- never a crash, never a silent success.
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/checkpoint.hpp>

using namespace sluice;

namespace {

struct bad_case {
  std::string name, kind, path, rule, file, tensor;
};

std::string bad_dir() { return std::string(SLUICE_TEST_DATA_DIR) + "/bad"; }

std::vector<bad_case> load_cases() {
  std::ifstream f(bad_dir() + "/cases.tsv");
  REQUIRE(f.good());
  std::vector<bad_case> out;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    bad_case c;
    std::getline(in, c.name, '\t');
    std::getline(in, c.kind, '\t');
    std::getline(in, c.path, '\t');
    std::getline(in, c.rule, '\t');
    std::getline(in, c.file, '\t');
    std::getline(in, c.tensor, '\t');
    if (c.tensor == "-") c.tensor.clear();
    out.push_back(c);
  }
  return out;
}

const std::set<std::string> index_rules{"index-json", "shard-name", "missing-shard", "missing-tensor", "unindexed-tensor",
                                        "total-size"};

}  // namespace

TEST_CASE("every malformed file in the corpus gives its typed error naming the file, the tensor and the rule",
          "[format][safetensors][index][corpus]") {
  const auto cases = load_cases();
  REQUIRE(cases.size() >= 40);
  for (const auto& c : cases) {
    CAPTURE(c.name, c.rule, c.file, c.tensor);
    const auto path = bad_dir() + "/" + c.path;
    try {
      const auto ck = checkpoint::open(std::filesystem::path(path));
      FAIL_CHECK("accepted: " << ck.tensors().size() << " tensors");
    } catch (const format_error& e) {
      CAPTURE(e.what());
      CHECK(e.rule() == c.rule);
      CHECK(e.file() == bad_dir() + "/" + c.file);
      CHECK(e.tensor() == c.tensor);
      // Index problems are index_errors; a bad shard header met through an index stays a format_error.
      const bool index_problem = index_rules.contains(c.rule) || (c.kind == "index" && c.rule == "duplicate-name");
      CHECK((dynamic_cast<const index_error*>(&e) != nullptr) == index_problem);
      // what() is one line that carries the rule, the file and the tensor.
      const std::string what = e.what();
      CHECK(what.find('\n') == std::string::npos);
      CHECK(what.rfind(c.rule + ": ", 0) == 0);
      CHECK(what.find(e.file()) != std::string::npos);
      if (!c.tensor.empty()) CHECK(what.find("tensor '" + c.tensor + "'") != std::string::npos);
    }
  }
}

TEST_CASE("the corpus has a case for every header and index rule", "[format][corpus]") {
  std::set<std::string> rules;
  for (const auto& c : load_cases()) rules.insert(c.rule);
  for (const char* r : {"header-length", "header-json", "duplicate-name", "metadata", "tensor-entry", "dtype", "shape",
                        "data-offsets", "tensor-size", "layout", "data-end", "index-json", "shard-name", "missing-shard",
                        "missing-tensor", "unindexed-tensor", "total-size"}) {
    CAPTURE(r);
    CHECK(rules.contains(r));
  }
}

TEST_CASE("every prefix of a valid file is rejected with a format_error, never accepted or crashed",
          "[format][safetensors][corpus]") {
  const auto path = std::string(SLUICE_TEST_DATA_DIR) + "/../fuzz/corpus/header/good-odd";
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  const std::string whole((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto* bytes = reinterpret_cast<const std::byte*>(whole.data());
  REQUIRE_NOTHROW(format::parse_header(std::span<const std::byte>(bytes, whole.size()), whole.size(), "good-odd"));
  for (std::size_t n = 0; n < whole.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(format::parse_header(std::span<const std::byte>(bytes, n), n, "prefix"), format_error);
  }
}
