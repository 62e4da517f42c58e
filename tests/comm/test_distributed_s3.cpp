// Tests for include/sluice/s3/distributed.hpp: a generated checkpoint
// uploaded to the S3 test server (moto with SigV4 checking, see
// tests/source/s3_test_support.hpp), loaded by N forked ranks talking Gloo
// over loopback, each reading only its planned slices from S3.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/sink/digest_sink.hpp>
#include <sluice/s3/distributed.hpp>
#include <sluice/testing/generator.hpp>

#include "multiprocess.hpp"
#include "rank_json.hpp"
#include "recording_sink.hpp"
#include "source/s3_test_support.hpp"

using namespace sluice;
using namespace std::chrono_literals;
using sluice_test::servers;
namespace fs = std::filesystem;


namespace {

using sluice_test::recording_sink;

// The small model of test_distributed.cpp (many windows, sliced tensors),
// with 2 MiB shared tables: slices of s3_catalog::staged_below (1 MiB) or more
// are read straight into place, smaller ones staged and merged.
const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    testing::generator_options o;
    o.experts = 8;
    o.layers = 3;
    o.engram_rows = 16384;
    o.max_shard_bytes = 128u << 10;
    auto d = sluice_test::process_dir("dist-s3-ckpt");
    testing::write_checkpoint(d, o);
    return d;
  }();
  return dir;
}

distributed_options small_options() {
  distributed_options o;
  o.load.staging_budget = 8u << 20;
  o.load.max_read = 1u << 20;
  o.load.register_buffers = false;
  o.plan.window_bytes = 96u << 10;
  o.plan.split_bytes = 64u << 10;
  return o;
}

// The test server's config: its IAM key pair, 4 connections (for the node).
constexpr std::size_t node_connections = 4;
s3::config s3_config() {
  auto c = sluice_test::test_config(servers().http);
  c.max_connections = node_connections;
  return c;
}

task<void> upload_dir(s3::client& c, std::string bucket, std::string prefix, fs::path dir, bool create) {
  if (create) co_await c.create_bucket(bucket);
  for (const auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> body(chars.size());
    std::memcpy(body.data(), chars.data(), chars.size());
    (void)co_await c.put(bucket, prefix + f.path().filename().string(), body);
  }
}

// Uploads the generated checkpoint under `prefix` ("ck/") of `bucket`.
void upload(const std::string& bucket, const std::string& prefix, bool create_bucket = false) {
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), s3_config());
  run_blocking(ioc, upload_dir(c, bucket, prefix, checkpoint_dir(), create_bucket));
}

// The bucket every test reads, with the checkpoint under "ck/" (uploaded once).
const std::string& bucket() {
  static const std::string b = [] {
    auto name = sluice_test::unique_bucket("dist");
    upload(name, "ck/", true);
    return name;
  }();
  return b;
}

std::map<std::string, std::string> reference_digests() {
  auto ck = checkpoint::open(checkpoint_dir());
  digest_sink d;
  load_options lo;
  lo.register_buffers = false;
  lo.staging_budget = 8u << 20;
  lo.max_read = 1u << 20;
  (void)load(ck, d, lo);
  std::map<std::string, std::string> m;
  for (auto& [n, t] : d.digests()) m[n] = t.sha256;
  return m;
}

struct run_options {
  distributed_options dopt = small_options();
  bool open_after_joining = false;  // the s3_location overload (as sluice-load calls it)
  std::function<std::string(std::size_t)> prefix = [](std::size_t) { return std::string("ck/"); };
  std::function<void(std::size_t, const checkpoint&, const std::string&)> after_open;
  open_options open;      // e.g. a local index
  std::string endpoint;   // e.g. a logging proxy's; empty: the test server
};

s3::config config_for(const run_options& ro) {
  auto c = s3_config();
  if (!ro.endpoint.empty()) c.endpoint = s3::http_endpoint::parse(ro.endpoint);
  return c;
}

// Runs `n` ranks loading s3://bucket/<prefix(rank)>; each writes its result
// (or error) to out/rank<r>.json.
std::vector<nlohmann::json> run_load(std::size_t n, const std::string& topology, const std::string& offload,
                                     const run_options& ro = {}) {
  const auto& b = bucket();  // uploaded before forking
  const auto store = sluice_test::fresh_dir("dist-s3-store");
  const auto out = sluice_test::fresh_dir("dist-s3-out");
  auto res = sluice_test::run_ranks(
      n,
      [&](std::size_t rank) {
        nlohmann::json j;
        int code = 0;
        try {
          comm::rank_info who;
          who.hostname = "127.0.0.1";  // every "node" of the test is this machine
          who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n;
          who.store_dir = store.string();
          who.timeout = 20s;
          const std::string uri = "s3://" + b + "/" + ro.prefix(rank);
          recording_sink s;
          distributed_stats st;
          if (ro.open_after_joining) {
            st = load_distributed(s3_location(uri, config_for(ro)), topology, offload, who, s, ro.dopt, ro.open);
          } else {
            s3_catalog cat(uri, config_for(ro));
            auto ck = checkpoint::open(cat, ro.open);
            if (ro.after_open) ro.after_open(rank, ck, ro.prefix(rank));
            st = load_distributed(ck, topology, offload, who, s, ro.dopt);  // reads through ck.storage(): cat
          }
          j["stats"] = st.to_json();
          for (auto& [name, d] : s.digests.digests()) j["digests"][name] = d.sha256;
          j["calls"] = s.calls;
        } catch (const std::exception& e) {
          j["error"] = e.what();
          code = 3;
        }
        sluice_test::write_rank_json(out, rank, j);
        return code;
      },
      120s);
  auto results = sluice_test::read_rank_jsons(out, res);
  fs::remove_all(store);
  fs::remove_all(out);
  return results;
}

// Every rank holds exactly its tensors, equal to the single-process local
// load; every tensor byte was read from S3 once over all ranks.
std::vector<nlohmann::json> check_load(std::size_t n, const std::string& topology, const std::string& offload,
                                       const run_options& ro, std::size_t want_connections) {
  INFO(n << " ranks, " << topology << ", " << offload);
  const auto ref = reference_digests();
  auto ck = checkpoint::open(checkpoint_dir());
  auto opt = ro.dopt;
  opt.plan.local_size = n;
  const auto plan = plan_for(ck, topology, offload, opt);
  const auto results = run_load(n, topology, offload, ro);
  std::uint64_t read = 0, storage = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 2000));
    REQUIRE(j["exit"] == 0);
    std::set<std::string> owned, got;
    for (const auto& e : plan.entries)
      if (e.owners.contains(static_cast<policy::rank_t>(r))) owned.insert(e.info.name);
    for (auto& [name, sha] : j["digests"].items()) {
      got.insert(name);
      REQUIRE(sha.get<std::string>() == ref.at(name));
    }
    REQUIRE(got == owned);
    REQUIRE(j["calls"] == results[0]["calls"]);  // every sink saw the same sequence
    REQUIRE(j["calls"].size() == ck.tensors().size());
    REQUIRE(j["stats"]["connections"].get<std::size_t>() == want_connections);
    read += j["stats"]["bytes_read"].get<std::uint64_t>();
    storage += j["stats"]["storage_bytes"].get<std::uint64_t>();
  }
  REQUIRE(read == ck.tensor_bytes());
  REQUIRE(storage == ck.tensor_bytes());  // each byte fetched from S3 once, by one rank
  return results;
}

// The metadata requests a logging proxy saw per object key of `bucket`:
// HEADs, and GETs from byte 0 (the index, a header's speculative prefix; no
// tensor starts there). Data GETs are not counted.
struct metadata_requests {
  std::map<std::string, std::size_t> heads, gets_from_0;
  std::size_t listings = 0;
};
metadata_requests count_metadata(const fs::path& log, const std::string& bucket) {
  metadata_requests m;
  std::ifstream in(log);
  std::string line;
  const std::string head = "/" + bucket + "/";
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    auto path = j["path"].get<std::string>();
    const bool query = path.find('?') != std::string::npos;
    path = path.substr(0, path.find('?'));
    const auto method = j["method"].get<std::string>();
    if (!path.starts_with(head)) {
      m.listings += method == "GET" && query;
      continue;
    }
    const auto key = path.substr(head.size());
    if (method == "HEAD") ++m.heads[key];
    if (method == "GET" && j["range"].get<std::string>().starts_with("bytes=0-")) ++m.gets_from_0[key];
  }
  return m;
}

}  // namespace

TEST_CASE("each rank's S3 connections are the node's divided among its local ranks, unless set per rank",
          "[comm][distributed][s3]") {
  STATIC_REQUIRE(rank_connections(16, 4) == 4);
  STATIC_REQUIRE(rank_connections(16, 3) == 5);
  STATIC_REQUIRE(rank_connections(4, 8) == 1);   // at least one
  STATIC_REQUIRE(rank_connections(16, 0) == 16);
  STATIC_REQUIRE(rank_connections(16, 8, 6) == 6);
}

TEST_CASE("a one-rank distributed load from S3 equals the local load", "[comm][distributed][s3]") {
  REQUIRE_S3_SERVERS();
  const auto& b = bucket();
  recording_sink s;
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  auto st = load_distributed(s3_location("s3://" + b + "/ck/", s3_config()), "tp1,dp1,ep1", "shared-cooperative", who, s,
                             small_options());
  const auto ref = reference_digests();
  const auto tensor_bytes = checkpoint::open(checkpoint_dir()).tensor_bytes();
  REQUIRE(s.digests.digests().size() == ref.size());
  for (auto& [n, d] : s.digests.digests()) REQUIRE(d.sha256 == ref.at(n));
  CHECK(st.bytes_read == tensor_bytes);
  CHECK(st.storage_bytes == tensor_bytes);
  CHECK(st.connections == node_connections);
  // Adjacent small slices share a GET (each GET costs a round trip).
  const auto tensors = checkpoint::open(checkpoint_dir()).tensors().size();
  CHECK(st.requests < tensors / 2);
  CHECK(st.shared_views == 4);
  CHECK(st.windows > 1);
}

TEST_CASE("2 ranks load from S3 with cooperative shared tables: exact tensors, each byte read once",
          "[comm][distributed][s3]") {
  REQUIRE_S3_SERVERS();
  run_options ro;
  ro.open_after_joining = true;
  check_load(2, "tp1,dp2,ep2", "shared-cooperative", ro, node_connections / 2);
}

TEST_CASE("4 ranks load from S3 with cooperative shared tables: exact tensors, each byte read once",
          "[comm][distributed][s3]") {
  REQUIRE_S3_SERVERS();
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", {}, node_connections / 4);
}

TEST_CASE("from S3, what a rank reads alone comes at delivery: exact tensors, each byte fetched once",
          "[comm][distributed][s3][pieces]") {
  REQUIRE_S3_SERVERS();
  run_options ro;
  ro.dopt.pieces_above = 1;           // every tensor a rank gets whole through its own reads
  ro.dopt.load.max_read = 16u << 10;  // several pieces (range GETs) per tensor
  // On one node the node window carries what a rank keeps and another read;
  // the rest (its own experts, here) it reads at delivery.
  const auto results = check_load(4, "tp1,dp4,ep4", "none", ro, node_connections / 4);
  std::uint64_t delivered = 0;
  for (const auto& j : results) delivered += j["stats"]["delivered_read_bytes"].get<std::uint64_t>();
  CHECK(delivered > 0);
}

TEST_CASE("connections per rank can be set explicitly", "[comm][distributed][s3]") {
  REQUIRE_S3_SERVERS();
  run_options ro;
  ro.dopt.connections_per_rank = 3;
  check_load(2, "tp1,dp2,ep2", "shared-cooperative", ro, 3);
}

TEST_CASE("a rank among fewer table readers than local ranks reads the tables with their share of the node's connections",
          "[comm][distributed][s3][sizing]") {
  REQUIRE_S3_SERVERS();
  STATIC_REQUIRE(rank_connections(16, reader_sizing{8, 0, 1}) == 16);  // a lone reader: the node's connections
  STATIC_REQUIRE(rank_connections(16, reader_sizing{8, 0, 3}) == 5);
  STATIC_REQUIRE(rank_connections(16, reader_sizing{8, 0, 0}) == 2);   // every rank reading: its share
  STATIC_REQUIRE(rank_connections(16, reader_sizing{8, 2, 1}) == 16);  // 2 per rank: the node has 16
  constexpr std::size_t n = 4;
  run_options ro;
  // One shared table (the rest ordinary weights): under shared-single one rank reads it alone.
  ro.dopt.classify.table_pattern = R"(engram\.0\.table$)";
  ro.dopt.classify.table_min_bytes = 0;
  for (const std::string offload : {"shared-single", "shared-cooperative"}) {
    INFO(offload);
    auto ck = checkpoint::open(checkpoint_dir());
    auto popt = ro.dopt;
    popt.plan.local_size = n;
    std::set<std::size_t> readers;
    for (const auto& e : plan_for(ck, "tp1,dp4,ep4", offload, popt).entries)
      if (e.shared())
        for (const auto& r : e.reads)
          if (r.size) readers.insert(r.reader);
    if (offload == "shared-single") REQUIRE(readers.size() == 1);  // the lone reader: all 4 connections
    else REQUIRE(readers.size() == n);
    const auto results = run_load(n, "tp1,dp4,ep4", offload, ro);
    std::uint64_t storage = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const auto& st = results[r]["stats"];
      INFO("rank " << r << ": " << results[r].dump().substr(0, 1500));
      REQUIRE(results[r]["exit"] == 0);
      REQUIRE(st["connections"].get<std::size_t>() == node_connections / n);  // the windows: its share
      REQUIRE(st["table_readers"].get<std::size_t>() == readers.size());
      const std::size_t want = readers.contains(r) ? node_connections / readers.size() : 0;
      REQUIRE(st["table_connections"].get<std::size_t>() == want);
      if (readers.contains(r))  // GETs in flight: 2 per connection, or the load's queue depth if larger
        REQUIRE(st["table_queue_depth"].get<std::size_t>() == std::max<std::size_t>(popt.load.queue_depth, 2 * want));
      storage += st["storage_bytes"].get<std::uint64_t>();
    }
    REQUIRE(storage == ck.tensor_bytes());  // the tables' reader's GETs counted, each byte once
  }
}

TEST_CASE("an S3 object missing on one rank's path makes every rank fail naming the rank and the key",
          "[comm][distributed][s3]") {
  REQUIRE_S3_SERVERS();
  REQUIRE(sluice_test::python_has_module("boto3"));  // the project's Python environment
  const auto& b = bucket();
  upload(b, "ck-r1/");  // rank 1's own copy
  auto ck = checkpoint::open(checkpoint_dir());
  auto opt = small_options();
  opt.plan.local_size = 4;
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", opt);
  std::string victim;  // a shard that rank 1 reads from
  for (const auto& e : plan.entries)
    for (const auto& r : e.reads)
      if (r.reader == 1 && victim.empty()) victim = ck.shards()[ck.tensors()[e.index].shard].name;
  REQUIRE_FALSE(victim.empty());
  run_options ro;
  ro.prefix = [](std::size_t rank) { return std::string(rank == 1 ? "ck-r1/" : "ck/"); };
  // Rank 1 opened its checkpoint (headers read, ETags pinned); then the object goes.
  ro.after_open = [&](std::size_t rank, const checkpoint&, const std::string& prefix) {
    if (rank == 1 && !sluice_test::delete_object(b, prefix + victim)) throw std::runtime_error("delete_object failed");
  };
  const auto results = run_load(4, "tp1,dp4,ep4", "shared-cooperative", ro);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].dump());
    REQUIRE(results[r]["exit"] == 3);
    REQUIRE_FALSE(results[r]["timed_out"].get<bool>());
    const auto msg = results[r]["error"].get<std::string>();
    REQUIRE_THAT(msg, Catch::Contains("rank 1 failed while reading"));
    REQUIRE_THAT(msg, Catch::Contains("ck-r1/" + victim));
  }
}

TEST_CASE("the draft module from S3 under tp1,dp8,ep8 through a local index: each selected byte read once, no other object touched",
          "[comm][distributed][s3][draft]") {
  REQUIRE_S3_SERVERS();
  const auto& b = bucket();
  // The engine's local index of the draft module (layer `layers`, three shards).
  const auto prefix = fmt::format("model.layers.{}.", 3);
  nlohmann::json full, draft;
  std::ifstream(checkpoint_dir() / "model.safetensors.index.json") >> full;
  std::set<std::string> draft_shards;
  for (auto& [t, sh] : full["weight_map"].items())
    if (t.starts_with(prefix)) {
      draft["weight_map"][t] = sh;
      draft_shards.insert(sh.get<std::string>());
    }
  REQUIRE(draft_shards.size() == 3);
  const auto dir = sluice_test::fresh_dir("dist-s3-draft");
  const auto index = dir / "draft.index.json";
  std::ofstream(index) << draft.dump();
  const auto log = dir / "requests.jsonl";
  sluice_test::fault_proxy proxy = sluice_test::fault_proxy::logging(servers().http, log.string());

  open_options local;
  local.index = index;
  const auto ck = checkpoint::open(checkpoint_dir(), local);  // the same selection, locally: the reference
  REQUIRE(ck.shards().size() == 3);
  constexpr std::size_t n = 8;
  auto popt = small_options();
  popt.plan.local_size = n;
  const auto plan = plan_for(ck, "tp1,dp8,ep8", "none", popt);
  std::map<std::string, std::string> ref;
  {
    digest_sink d;
    load_options lo;
    lo.register_buffers = false;
    (void)load(ck, d, lo);
    for (auto& [name, t] : d.digests()) ref[name] = t.sha256;
  }

  run_options ro;
  ro.open.index = index;
  ro.endpoint = proxy.endpoint;
  const auto results = run_load(n, "tp1,dp8,ep8", "none", ro);
  std::uint64_t read = 0, storage = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 2000));
    REQUIRE(j["exit"] == 0);
    std::set<std::string> owned, got;
    for (const auto& e : plan.entries)
      if (e.owners.contains(static_cast<policy::rank_t>(r))) owned.insert(e.info.name);
    for (auto& [name, sha] : j["digests"].items()) {
      got.insert(name);
      REQUIRE(sha.get<std::string>() == ref.at(name));
    }
    REQUIRE(got == owned);
    REQUIRE(j["calls"].size() == ck.tensors().size());
    read += j["stats"]["bytes_read"].get<std::uint64_t>();
    storage += j["stats"]["storage_bytes"].get<std::uint64_t>();
  }
  REQUIRE(read == ck.tensor_bytes());     // each selected byte read once, by one rank
  REQUIRE(storage == ck.tensor_bytes());  // and fetched from S3 once
  // Requests per object: the prefix listing and the three draft shards, nothing else.
  const auto per_object = sluice_test::requests_per_object(log.string(), b);
  std::string seen;
  for (const auto& [k, c] : per_object) seen += fmt::format("{} x{}\n", k.empty() ? "(listing)" : k, c);
  INFO(seen);
  std::set<std::string> touched, want{""};
  for (const auto& [k, c] : per_object) touched.insert(k);
  for (const auto& sh : draft_shards) want.insert("ck/" + sh);
  REQUIRE(touched == want);
  fs::remove_all(dir);
}

TEST_CASE("8 ranks loading from S3 fetch the index and each shard header once per world, not once per rank",
          "[comm][distributed][s3][open]") {
  REQUIRE_S3_SERVERS();
  const auto& b = bucket();
  const auto dir = sluice_test::fresh_dir("dist-s3-headers");
  const auto log = dir / "requests.jsonl";
  sluice_test::fault_proxy proxy = sluice_test::fault_proxy::logging(servers().http, log.string());

  constexpr std::size_t n = 8;
  run_options ro;
  ro.open_after_joining = true;  // load_distributed(s3_location(...)), as sluice-load --ranks calls it
  ro.endpoint = proxy.endpoint;
  const auto results = check_load(n, "tp1,dp8,ep8", "shared-cooperative", ro, 1);  // 4 connections, 8 ranks: 1 each
  // What one rank reads to open it (not through the proxy). Opened after the
  // ranks were forked: the S3 client's threads would make the fork
  // multi-threaded (TSan refuses to start threads in such a child).
  s3_catalog cat("s3://" + b + "/ck/", s3_config());
  const auto single = checkpoint::open(cat);
  REQUIRE(single.shards().size() >= 4);
  std::uint64_t opened = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const auto bytes = results[r]["stats"]["header_bytes_read"].get<std::uint64_t>();
    CHECK(bytes == (r == 0 ? single.header_bytes_read() : 0));
    opened += bytes;
  }
  CHECK(opened == single.header_bytes_read());  // one rank's worth over the world

  auto m = count_metadata(log, b);
  std::string seen;
  for (const auto& [k, c] : m.gets_from_0) seen += fmt::format("GET from 0 {} x{}\n", k, c);
  for (const auto& [k, c] : m.heads) seen += fmt::format("HEAD {} x{}\n", k, c);
  INFO(seen);
  REQUIRE(m.gets_from_0.at("ck/model.safetensors.index.json") == 1);
  for (const auto& sh : single.shards()) {
    INFO(sh.name);
    REQUIRE(m.gets_from_0.at("ck/" + sh.name) == 1);  // one header GET per world
    // At most one HEAD: rank 0's; the other ranks' data reads use the ETags it saw.
    REQUIRE(m.heads["ck/" + sh.name] <= 1);
  }
  fs::remove_all(dir);
}
