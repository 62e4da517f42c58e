// Tests for open_options::index (checkpoint.hpp) over S3, and the draft
// model loaded from S3: a generated checkpoint in the S3 test server, opened
// through a local index, every request seen by a logging proxy
// (tests/support/fault_proxy.js --log) and counted per object.
#include <sluice/s3/source.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/load_file.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/testing/generator.hpp>

#include "s3_test_support.hpp"
#include "support/temp_dir.hpp"

using namespace sluice;
using sluice_test::servers;
namespace fs = std::filesystem;

namespace {

testing::generator_options model() {
  testing::generator_options o;
  o.experts = 8;
  o.layers = 3;
  o.max_shard_bytes = 128u << 10;
  return o;
}

// A directory of the test's own, removed with its holder.
using scratch = sluice_test::temp_dir;

task<void> upload_dir(s3::client& c, std::string bucket, std::string prefix, fs::path dir,
                      std::map<std::string, std::string>& etags) {
  co_await c.create_bucket(bucket);
  for (const auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> body(chars.size());
    std::memcpy(body.data(), chars.data(), chars.size());
    etags[f.path().filename().string()] = co_await c.put(bucket, prefix + f.path().filename().string(), body);
  }
}

// The generated checkpoint, local and uploaded under "ck/" of its own bucket
// (index included), with the ETag of each object.
struct remote_checkpoint {
  scratch root{"s3-index"};
  fs::path dir = root.path() / "ckpt";
  testing::checkpoint_layout layout = testing::write_checkpoint(dir, model());
  std::string bucket = sluice_test::unique_bucket("index");
  std::map<std::string, std::string> etags;
  std::set<std::string> draft_shards, draft_tensors;
  std::uint64_t draft_bytes = 0;
  std::map<std::string, std::uint64_t> draft_bytes_in;  // per shard

  remote_checkpoint() {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
    run_blocking(ioc, upload_dir(c, bucket, "ck/", dir, etags));
    const auto prefix = fmt::format("model.layers.{}.", model().layers);
    for (const auto& t : layout.tensors)
      if (t.name.starts_with(prefix)) {
        draft_tensors.insert(t.name);
        draft_shards.insert(layout.shards[t.shard].name);
        draft_bytes += t.size;
        draft_bytes_in[layout.shards[t.shard].name] += t.size;
      }
    REQUIRE(draft_shards.size() == 3);
  }

  // A local index of the draft module: `where(tensor, real shard)` names its
  // shard; records each draft shard's size and ETag unless told otherwise.
  fs::path draft_index(const std::function<std::string(const std::string&, const std::string&)>& where = {},
                       const std::map<std::string, std::string>& etag_override = {}) const {
    const auto p = root.path() / "draft.index.json";
    nlohmann::json j;
    for (const auto& t : layout.tensors)
      if (draft_tensors.contains(t.name)) {
        const auto& real = layout.shards[t.shard].name;
        j["weight_map"][t.name] = where ? where(t.name, real) : real;
      }
    for (const auto& s : draft_shards) {
      j["metadata"]["shards"][s]["size"] = fs::file_size(dir / s);
      j["metadata"]["shards"][s]["etag"] = etag_override.contains(s) ? etag_override.at(s) : etags.at(s);
    }
    std::ofstream(p) << j.dump(1);
    return p;
  }
  [[nodiscard]] std::string uri() const { return "s3://" + bucket + "/ck/"; }
  // The shards' names, sorted: the order an open reads their headers in.
  [[nodiscard]] std::vector<std::string> sorted_shards() const {
    std::vector<std::string> v;
    for (const auto& s : layout.shards) v.push_back(s.name);
    std::sort(v.begin(), v.end());
    return v;
  }
};

const remote_checkpoint& remote() {
  static const remote_checkpoint r;
  return r;
}

// A logging proxy in front of the test server, and a config that goes through
// it; `fault`: the proxy's fault arguments (default: forward everything).
struct logged {
  explicit logged(std::vector<std::string> fault = {"--fault", "none"}) : proxy(with_log(std::move(fault))) {}
  scratch log_dir{"s3-index-log"};
  fs::path log = log_dir.path() / "requests.jsonl";
  sluice_test::fault_proxy proxy;
  s3::config cfg() const { return sluice_test::test_config(proxy.endpoint); }
  std::vector<std::string> with_log(std::vector<std::string> fault) const {
    fault.insert(fault.begin(), {"--upstream", servers().http, "--log", log.string()});
    return fault;
  }
  [[nodiscard]] std::map<std::string, std::size_t> per_object() const {
    return sluice_test::requests_per_object(log.string(), remote().bucket);
  }
  // The ranges requested of `key` (GETs with a Range header), as [first, last].
  [[nodiscard]] std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges(const std::string& key) const {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (const auto& j : sluice_test::proxy_log(log.string())) {
      auto path = j["path"].get<std::string>();
      path = path.substr(0, path.find('?'));
      const auto range = j["range"].get<std::string>();
      if (path != "/" + remote().bucket + "/" + key || range.empty()) continue;
      std::uint64_t a = 0, b = 0;
      REQUIRE(std::sscanf(range.c_str(), "bytes=%lu-%lu", &a, &b) == 2);
      out.emplace_back(a, b);
    }
    return out;
  }
};

std::string dump(const std::map<std::string, std::size_t>& m) {
  std::string s;
  for (const auto& [k, n] : m) s += fmt::format("{} x{}\n", k.empty() ? "(listing)" : k, n);
  return s;
}

}  // namespace

TEST_CASE("the draft module from S3 through a local index touches its three shards and no other object",
          "[source][s3][index][draft]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  const auto index = r.draft_index();
  logged l;
  open_options opt;
  opt.index = index;
  const auto ck = checkpoint::open(std::make_shared<s3_catalog>(r.uri(), l.cfg()), opt);
  std::set<std::string> tensors;
  for (const auto& t : ck.tensors()) tensors.insert(t.name);
  REQUIRE(tensors == r.draft_tensors);
  REQUIRE(ck.tensor_bytes() == r.draft_bytes);

  digest_sink got;
  load_options lo;
  lo.staging_budget = 8u << 20;
  lo.max_read = 1u << 20;
  const auto st = load(ck, got, lo);
  CHECK(st.bytes_read == r.draft_bytes);

  // The bytes are the generator's (the local checkpoint's, selected alike).
  open_options local;
  local.select = [&](std::string_view n) { return r.draft_tensors.contains(std::string(n)); };
  digest_sink want;
  (void)load(checkpoint::open(r.dir, local), want, lo);
  REQUIRE(got.digests().size() == want.digests().size());
  for (const auto& [n, d] : want.digests()) CHECK(got.digests().at(n).sha256 == d.sha256);

  // Requests per object: one listing of the prefix, and for each draft shard
  // one header GET (the speculative prefix) plus GETs of exactly its tensor
  // bytes. No HEAD (the listing had sizes and ETags), no other object, not
  // even the location's own index.
  const auto n = l.per_object();
  INFO(dump(n));
  std::set<std::string> touched;
  for (const auto& [k, c] : n) touched.insert(k);
  std::set<std::string> want_touched{""};
  for (const auto& s : r.draft_shards) want_touched.insert("ck/" + s);
  REQUIRE(touched == want_touched);
  CHECK(n.at("") == 1);
  for (const auto& s : r.draft_shards) {
    INFO(s);
    const auto ranges = l.ranges("ck/" + s);
    CHECK(ranges.size() == n.at("ck/" + s));  // every request a range GET
    std::size_t header_gets = 0;
    std::uint64_t data = 0;
    for (auto [a, b] : ranges) {
      if (a == 0) ++header_gets;
      else data += b - a + 1;
    }
    CHECK(header_gets == 1);
    CHECK(data == r.draft_bytes_in.at(s));  // each tensor byte once
  }
}

TEST_CASE("a stale local index (a tensor in the wrong shard) fails naming it before any tensor byte is fetched",
          "[source][s3][index]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  const std::string moved = *r.draft_tensors.begin();
  std::string wrong;
  const auto index = r.draft_index([&](const std::string& t, const std::string& real) {
    if (t != moved) return real;
    for (const auto& s : r.draft_shards)
      if (s != real) wrong = s;
    return wrong;
  });
  logged l;
  open_options opt;
  opt.index = index;
  try {
    (void)checkpoint::open(std::make_shared<s3_catalog>(r.uri(), l.cfg()), opt);
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK(e.rule() == "missing-tensor");
    CHECK(e.tensor() == moved);
    CHECK_THAT(e.what(), Catch::Contains(wrong));
  }
  for (const auto& s : r.draft_shards)
    for (auto [a, b] : l.ranges("ck/" + s)) CHECK(a == 0);  // header reads only
}

TEST_CASE("a local index naming a shard missing from S3 fails naming it, before any GET of an object",
          "[source][s3][index]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  const auto gone = *r.draft_shards.rbegin();
  const std::string renamed = "model-99999-of-99999.safetensors";
  const auto index = r.draft_index([&](const std::string&, const std::string& real) { return real == gone ? renamed : real; });
  logged l;
  open_options opt;
  opt.index = index;
  try {
    (void)checkpoint::open(std::make_shared<s3_catalog>(r.uri(), l.cfg()), opt);
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK(e.rule() == "missing-shard");
    CHECK_THAT(e.what(), Catch::Contains(renamed));
    CHECK(e.file() == index.string());
  }
  const auto n = l.per_object();
  INFO(dump(n));
  CHECK(n == std::map<std::string, std::size_t>{{"", 1}});  // the listing, nothing else
}

TEST_CASE("a local index whose recorded ETag disagrees with the object fails naming the shard, before any GET",
          "[source][s3][index]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  const auto victim = *r.draft_shards.begin();
  std::string other_etag;
  for (const auto& [name, etag] : r.etags)
    if (etag != r.etags.at(victim)) other_etag = etag;
  const auto index = r.draft_index({}, {{victim, other_etag}});
  logged l;
  open_options opt;
  opt.index = index;
  try {
    (void)checkpoint::open(std::make_shared<s3_catalog>(r.uri(), l.cfg()), opt);
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK(e.rule() == "stale-shard");
    CHECK_THAT(e.file(), Catch::EndsWith("ck/" + victim));
    CHECK_THAT(e.what(), Catch::Contains(other_etag));
  }
  const auto n = l.per_object();
  INFO(dump(n));
  CHECK(n == std::map<std::string, std::size_t>{{"", 1}});
}

TEST_CASE("opening from S3 asks for every shard's header at once, each once, not one round trip after another",
          "[source][s3][open]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  REQUIRE(r.layout.shards.size() >= 4);
  // Every range GET held 300 ms by the proxy, as by a distant server: GETs
  // sent one after another are never in flight together, whatever the
  // machine's speed.
  const logged l({"--fault", "delay", "--stall-ms", "300"});
  const auto cat = std::make_shared<s3_catalog>(r.uri(), l.cfg());
  const auto ck = checkpoint::open(cat, {});
  CHECK(ck.tensors().size() == r.layout.tensors.size());
  CHECK(ck.shards().size() == r.layout.shards.size());
  // The headers parsed, the catalog keeps none of the prefixes it fetched
  // for them (the checkpoint holds the catalog for its data path).
  CHECK(cat->held_prefix_bytes() == 0);

  std::map<std::string, std::size_t> header_gets;
  std::size_t most_at_once = 0;
  for (const auto& j : sluice_test::proxy_log(l.log.string())) {
    const auto path = j["path"].get<std::string>();
    if (!path.ends_with(".safetensors") || !j["range"].get<std::string>().starts_with("bytes=0-")) continue;
    ++header_gets[path];
    most_at_once = std::max<std::size_t>(most_at_once, j["inflight"].get<std::size_t>());
  }
  CHECK(header_gets.size() == r.layout.shards.size());
  for (const auto& [path, n] : header_gets) {
    INFO(path);
    CHECK(n == 1);
  }
  CHECK(most_at_once >= 2);  // one after another: exactly 1
}

TEST_CASE("shards replaced after the listing fail the open naming the first of them, in shard order",
          "[source][s3][open]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  REQUIRE(r.layout.shards.size() >= 4);
  const auto bucket = sluice_test::unique_bucket("open-changed");
  std::map<std::string, std::string> etags;
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
  run_blocking(ioc, upload_dir(c, bucket, "ck/", r.dir, etags));
  auto cat = std::make_shared<s3_catalog>("s3://" + bucket + "/ck/", sluice_test::test_config(servers().http));
  (void)cat->list();  // every object pinned to the ETag listed
  // Shards 1 and 3 (of the sorted shard names, the order the open reads
  // their headers in) change: their concurrent header GETs fail in either
  // order, and the open names shard 1, the first it reaches.
  const auto shards = r.sorted_shards();
  for (const auto i : {1, 3}) (void)run_blocking(ioc, c.put(bucket, "ck/" + shards[i], sluice_test::random_bytes(100, i)));
  try {
    (void)checkpoint::open(cat, {});
    FAIL("the open succeeded over changed shards");
  } catch (const s3_object_changed_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(shards[1]) != std::string::npos);
    CHECK(std::string(e.what()).find(shards[3]) == std::string::npos);
  }
}

TEST_CASE("a server failing every header GET fails the open naming the first shard, after one round of GETs",
          "[source][s3][open][hostile]") {
  REQUIRE_S3_SERVERS();
  const auto& r = remote();
  REQUIRE(r.layout.shards.size() >= 4);
  // Every range GET (the index's and the headers') answered 503 SlowDown.
  const logged l({"--fault", "503", "--every", "1"});
  auto cfg = l.cfg();
  cfg.max_connections = 2;
  // A local index: the location's own would fail first, before any header.
  const auto index = l.log_dir.path() / "model.safetensors.index.json";
  fs::copy_file(r.dir / "model.safetensors.index.json", index);
  open_options opt;
  opt.index = index.string();
  const auto shards = r.sorted_shards();
  try {
    (void)checkpoint::open(std::make_shared<s3_catalog>(r.uri(), cfg), opt);
    FAIL("the open succeeded through a server that fails every GET");
  } catch (const s3_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(shards[0]) != std::string::npos);
  }
  // The shards whose headers were asked for: the first round (one GET per
  // connection, each retried), none started after the first failure.
  std::set<std::string> asked;
  for (const auto& j : sluice_test::proxy_log(l.log.string()))
    if (const auto path = j["path"].get<std::string>(); path.ends_with(".safetensors")) asked.insert(path);
  CHECK(!asked.empty());
  CHECK(asked.size() <= 2);
}
