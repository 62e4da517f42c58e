// The metadata caps (format/limits.hpp) and the hostile checkpoints of issue
// 40: each ends in a named error, without a signal, and leaves nothing open.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>
#include <sluice/policy/classify.hpp>

#include "support/temp_dir.hpp"

using namespace sluice;
using namespace sluice::format;

namespace {

std::vector<std::byte> file_of(const std::string& json, std::size_t data_bytes) {
  return sluice_test::safetensors_file(json, data_bytes);
}

void write(const std::filesystem::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// The rule a header breaks under `lim`, or "accepted".
std::string header_rule(const std::string& json, std::size_t data_bytes, const limits& lim = {}) {
  const auto f = file_of(json, data_bytes);
  try {
    (void)parse_header(std::span<const std::byte>(f), f.size(), "mem.safetensors", lim);
  } catch (const format_error& e) {
    return e.rule();
  }
  return "accepted";
}

std::string index_rule(const std::string& json, const limits& lim = {}) {
  try {
    (void)parse_index(json, "mem.index.json", lim);
  } catch (const index_error& e) {
    return e.rule();
  }
  return "accepted";
}

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string entry(const std::string& name, std::uint64_t begin, std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(end - begin) + "],\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// This process's descriptors (the test's own files are closed by then).
std::size_t open_fds() {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) (void)e, ++n;
  return n;
}

}  // namespace

TEST_CASE("a shape nested a million levels deep is a named error, not a stack overflow", "[format][limits]") {
  const std::string json = R"({"a":{"dtype":"U8","shape":)" + nested(1'000'000) + R"(,"data_offsets":[0,0]}})";
  const auto f = file_of(json, 0);
  try {
    (void)parse_header(std::span<const std::byte>(f), f.size(), "deep.safetensors");
    FAIL("accepted");
  } catch (const format_error& e) {
    CHECK(e.rule() == "shape");
    CHECK(e.tensor() == "a");
    CHECK(std::string(e.what()).size() < 1024);  // the nesting is described, not serialised
  }
}

TEST_CASE("nesting deeper than max_depth is header-depth, whatever the grammar allows", "[format][limits]") {
  const std::string ok = "{" + entry("a", 0, 2) + "}";
  CHECK(header_rule(ok, 2) == "accepted");
  limits shallow;
  shallow.max_depth = 2;   // the shape array is the third level
  CHECK(header_rule(ok, 2, shallow) == "header-depth");
}

TEST_CASE("an index nested a million levels deep is index-depth", "[format][limits]") {
  const std::string json = R"({"metadata":{"total_size":)" + nested(1'000'000) + R"(},"weight_map":{"a":"s.safetensors"}})";
  CHECK(index_rule(json) == "index-depth");
  // Within the depth cap, a container where a number belongs is described, not dumped.
  const std::string shallow = R"({"metadata":{"total_size":[[[1]]]},"weight_map":{"a":"s.safetensors"}})";
  try {
    (void)parse_index(shallow, "mem.index.json");
    FAIL("accepted");
  } catch (const index_error& e) {
    CHECK(e.rule() == "index-json");
    CHECK_THAT(e.what(), Catch::Contains("an array of 1 entries"));
  }
}

TEST_CASE("more tensors than max_tensors is tensor-count, in a header and in an index", "[format][limits]") {
  limits three;
  three.max_tensors = 3;
  std::string json = "{" + entry("a", 0, 1) + "," + entry("b", 1, 2) + "," + entry("c", 2, 3) + "}";
  CHECK(header_rule(json, 3, three) == "accepted");
  json = "{" + entry("a", 0, 1) + "," + entry("b", 1, 2) + "," + entry("c", 2, 3) + "," + entry("d", 3, 4) + "}";
  CHECK(header_rule(json, 4, three) == "tensor-count");
  CHECK(index_rule(R"({"weight_map":{"a":"s","b":"s","c":"s"}})", three) == "accepted");
  CHECK(index_rule(R"({"weight_map":{"a":"s","b":"s","c":"s","d":"s"}})", three) == "tensor-count");
}

TEST_CASE("a million and a half zero-size tensors end at the default tensor cap at once", "[format][limits]") {
  const auto zero_size = [](int n) {
    std::string j = "{";
    for (int i = 0; i < n; ++i) {
      if (i) j += ',';
      j += "\"t";
      j += std::to_string(i);
      j += R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
    }
    return j + "}";
  };
  const std::string json = zero_size(1'500'000);
  CHECK(header_rule(json, 0) == "tensor-count");
  // Within a raised cap a large header parses (one pass, no DOM): here 200,000
  // entries, which the DOM-and-callback parser took tens of seconds for.
  limits raised;
  raised.max_tensors = 2'000'000;
  const auto f = file_of(zero_size(200'000), 0);
  const auto h = parse_header(std::span<const std::byte>(f), f.size(), "many.safetensors", raised);
  CHECK(h.tensors.size() == 200'000);
  CHECK(h.find("t199999") != nullptr);
}

TEST_CASE("a name longer than max_name_bytes is name-length, in a header and in an index", "[format][limits]") {
  const std::string at_cap(1024, 'n'), over(1025, 'n');
  CHECK(header_rule("{" + entry(at_cap, 0, 1) + "}", 1) == "accepted");
  CHECK(header_rule("{" + entry(over, 0, 1) + "}", 1) == "name-length");
  CHECK(index_rule(R"({"weight_map":{")" + over + R"(":"s"}})") == "name-length");
  CHECK(index_rule(R"({"weight_map":{"a":")" + over + R"("}})") == "shard-name");
  limits longer;
  longer.max_name_bytes = 2048;
  CHECK(header_rule("{" + entry(over, 0, 1) + "}", 1, longer) == "accepted");
}

TEST_CASE("a header longer than max_header_bytes is header-length", "[format][limits]") {
  limits small;
  small.max_header_bytes = 64;
  const std::string json = "{" + entry("a_rather_long_tensor_name_that_takes_room", 0, 1) + "}";
  CHECK(json.size() > 64);
  CHECK(header_rule(json, 1, small) == "header-length");
}

TEST_CASE("duplicate fields and a second __metadata__ are errors, not silently merged", "[format][limits]") {
  CHECK(header_rule(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1) == "tensor-entry");
  CHECK(header_rule(R"({"__metadata__":{},"__metadata__":{},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1) ==
        "duplicate-name");
}

TEST_CASE("a terabyte index is index-size before a byte of it is read, and nothing is left open", "[format][limits]") {
  sluice_test::temp_dir d("limits");
  write(d.path() / "s.safetensors", file_of("{" + entry("a", 0, 1) + "}", 1));
  {
    const int fd = ::open((d.path() / "model.safetensors.index.json").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{1} << 40) == 0);   // sparse: `truncate -s 1T`
    ::close(fd);
  }
  const auto fds = open_fds();
  try {
    (void)checkpoint::open(d.path());
    FAIL("accepted");
  } catch (const index_error& e) {
    CHECK(e.rule() == "index-size");
    CHECK_THAT(e.what(), Catch::Contains("1099511627776"));
  }
  CHECK(open_fds() == fds);
  // The same through a local index (open_options::index).
  open_options o;
  o.index = d.path() / "model.safetensors.index.json";
  CHECK_THROWS_AS(checkpoint::open(d.path(), o), index_error);
  CHECK(open_fds() == fds);
  // A raised cap is the caller's choice: then the read itself is bounded by the file.
  write(d.path() / "model.safetensors.index.json", std::string(R"({"weight_map":{"a":"s.safetensors"}})"));
  CHECK(checkpoint::open(d.path()).tensors().size() == 1);
}

TEST_CASE("a name with 200,000-digit layer and expert numbers is a named error through the placement rules",
          "[format][limits][policy]") {
  const std::string name = "model.layers." + std::string(200'000, '7') + ".mlp.experts." + std::string(200'000, '3') + ".w1.weight";
  // At the default cap, the header refuses it.
  CHECK(header_rule("{" + entry(name, 0, 4) + "}", 4) == "name-length");
  // Raised, the classifier's fixed rules parse it by hand (no regex recursion)
  // and refuse the number, naming the tensor.
  const policy::classifier c;
  policy::tensor_info t;
  t.name = name;
  t.size = 4;
  t.shape = {4};
  try {
    c.classify(t);
    FAIL("accepted");
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("the expert index '3333"));
    CHECK(std::string(e.what()).size() < 2048);
  }
  CHECK_THROWS_AS(c.layer(t), config_error);
}

TEST_CASE("every file of issue 40's table opens to its named error and leaves no descriptor or thread behind",
          "[format][limits]") {
  sluice_test::temp_dir d("table");
  auto dir = [&](const std::string& name) {
    const auto p = d.path() / name;
    std::filesystem::create_directories(p);
    return p;
  };
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  write(dir("deep-shape") / "model.safetensors",
        file_of(R"({"a":{"dtype":"U8","shape":)" + deep + R"(,"data_offsets":[0,0]}})", 0));
  write(dir("deep-total-size") / "s.safetensors", file_of("{" + entry("a", 0, 1) + "}", 1));
  write(d.path() / "deep-total-size" / "model.safetensors.index.json",
        std::string(R"({"metadata":{"total_size":)") + deep + R"(},"weight_map":{"a":"s.safetensors"}})");
  const std::string digits = "model.layers." + std::string(200'000, '7') + ".mlp.experts." + std::string(200'000, '3') + ".w1.weight";
  write(dir("long-digits") / "model.safetensors", file_of("{" + entry(digits, 0, 4) + "}", 4));
  write(dir("huge-index") / "s.safetensors", file_of("{" + entry("a", 0, 1) + "}", 1));
  {
    const int fd = ::open((d.path() / "huge-index" / "model.safetensors.index.json").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{1} << 40) == 0);
    ::close(fd);
  }
  std::string many = "{";
  for (int i = 0; i < 1'100'000; ++i) {
    if (i) many += ',';
    many += "\"t" + std::to_string(i) + R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
  }
  many += "}";
  write(dir("many-tensors") / "model.safetensors", file_of(many, 0));
  many.clear();
  many.shrink_to_fit();

  auto threads = [] {
    std::size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) (void)e, ++n;
    return n;
  };
  const auto fds = open_fds();
  const auto tasks = threads();
  for (const auto& [name, rule] : std::vector<std::pair<std::string, std::string>>{{"deep-shape", "shape"},
                                                                                    {"deep-total-size", "index-depth"},
                                                                                    {"long-digits", "name-length"},
                                                                                    {"huge-index", "index-size"},
                                                                                    {"many-tensors", "tensor-count"}}) {
    INFO(name);
    try {
      (void)checkpoint::open(d.path() / name);
      FAIL("accepted");
    } catch (const format_error& e) {
      CHECK(e.rule() == rule);
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
    CHECK(open_fds() == fds);
    CHECK(threads() == tasks);
  }
}
