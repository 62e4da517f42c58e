// Tests for the node-local cache (cache/block_cache.hpp, cache/read_through.hpp)
// against the SigV4-checking S3 test server behind the logging fault proxy
// (tests/support/fault_proxy.js --log): what each load asks of S3 is counted
// per object and per block; the bytes are checked against the local copy.
// Blocks are 64 KiB here so that a small generated checkpoint spans many.
#include <sluice/s3/source.hpp>

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/cache/block_cache.hpp>
#include <sluice/load_file.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/testing/generator.hpp>

#include "s3_test_support.hpp"
#include "support/temp_dir.hpp"

using namespace sluice;
using sluice_test::servers;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t block = 64 << 10;

testing::generator_options model() {
  testing::generator_options o;
  o.experts = 8;
  o.layers = 3;
  o.max_shard_bytes = 192u << 10;
  return o;
}

// A directory of the test's own, removed with its holder.
using scratch = sluice_test::temp_dir;

std::vector<std::byte> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(chars.size());
  std::memcpy(b.data(), chars.data(), chars.size());
  return b;
}

// The generated checkpoint, local and uploaded under "ck/" of a bucket of its
// own (one per test: tests rewrite objects).
struct remote_checkpoint {
  scratch root{"s3-cache"};
  fs::path dir = root.path() / "ckpt";
  testing::checkpoint_layout layout = testing::write_checkpoint(dir, model());
  std::string bucket = sluice_test::unique_bucket("cache");
  std::map<std::string, std::string> etags;

  remote_checkpoint() {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
    run_blocking(ioc, upload(c));
  }
  task<void> upload(s3::client& c) {
    co_await c.create_bucket(bucket);
    for (const auto& f : fs::directory_iterator(dir)) {
      const auto body = file_bytes(f.path());
      etags[f.path().filename().string()] = co_await c.put(bucket, "ck/" + f.path().filename().string(), body);
    }
  }
  // Replaces object `name` (and the local copy) with `body`.
  void rewrite(const std::string& name, const std::vector<std::byte>& body) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(body.data()),
                                                      static_cast<std::streamsize>(body.size()));
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
    etags[name] = run_blocking(ioc, c.put(bucket, "ck/" + name, body));
  }
  [[nodiscard]] std::string uri() const { return "s3://" + bucket + "/ck/"; }
  // Blocks of every object (shards and index).
  [[nodiscard]] std::uint64_t blocks() const {
    std::uint64_t n = 0;
    for (const auto& f : fs::directory_iterator(dir)) n += (fs::file_size(f.path()) + block - 1) / block;
    return n;
  }
};

// A logging proxy in front of the test server; configs through it with the cache in `cache_dir`.
struct logged {
  scratch home{"s3-cache-log"};   // the request log, and the fixture's cache
  fs::path log = home.path() / "requests.jsonl";
  sluice_test::fault_proxy proxy = sluice_test::fault_proxy::logging(servers().http, log.string());
  std::vector<std::string> warnings;
  s3::config cfg(const fs::path& cache_dir, std::uint64_t max_bytes = 0) {
    auto c = sluice_test::test_config(proxy.endpoint);
    c.cache.dir = cache_dir.string();
    c.cache.block_size = block;
    c.cache.max_bytes = max_bytes;
    c.cache.warn = [this](const std::string& w) { warnings.push_back(w); };
    return c;
  }
  // Lines logged so far (a load's requests: the lines after the last mark).
  [[nodiscard]] std::size_t lines() const {
    std::ifstream in(log);
    std::size_t n = 0;
    std::string line;
    while (std::getline(in, line)) ++n;
    return n;
  }
  // Requests after line `from`: (method, key, first byte, last byte); keys without
  // the bucket, the listing under "".
  struct request {
    std::string method, key;
    std::uint64_t first = 0, last = 0;
    bool ranged = false;
  };
  [[nodiscard]] std::vector<request> requests(std::size_t from, const std::string& bucket) const {
    std::vector<request> out;
    std::ifstream in(log);
    std::string line;
    for (std::size_t i = 0; std::getline(in, line); ++i) {
      if (i < from) continue;
      const auto j = nlohmann::json::parse(line);
      auto path = j["path"].get<std::string>();
      path = path.substr(0, path.find('?'));
      request r;
      r.method = j["method"].get<std::string>();
      const std::string head = "/" + bucket;
      r.key = path.size() > head.size() ? path.substr(head.size() + 1) : std::string();
      const auto range = j["range"].get<std::string>();
      if (!range.empty()) {
        REQUIRE(std::sscanf(range.c_str(), "bytes=%lu-%lu", &r.first, &r.last) == 2);
        r.ranged = true;
      }
      out.push_back(r);
    }
    return out;
  }
};

// What most tests start from: the checkpoint in its own bucket, a logging
// proxy in front of the server, a cache directory of the test's own.
struct fixture {
  remote_checkpoint r;
  logged l;
  fs::path cache_dir = l.home.path() / "cache";
};

// Requests for object bytes (anything but the listing), as "key@block" (every
// one must be one whole block).
std::vector<std::string> block_gets(const std::vector<logged::request>& rs, const remote_checkpoint& r) {
  std::vector<std::string> out;
  for (const auto& q : rs) {
    if (q.key.empty() || q.key == "ck/") continue;   // the listing
    INFO(q.method << " " << q.key << " " << q.first << "-" << q.last);
    REQUIRE(q.method == "GET");
    REQUIRE(q.ranged);
    CHECK(q.first % block == 0);
    const auto size = fs::file_size(r.dir / q.key.substr(3));
    CHECK(q.last + 1 == std::min(q.first + block, size));
    out.push_back(fmt::format("{}@{}", q.key, q.first / block));
  }
  return out;
}

load_options small_load() {
  load_options lo;
  lo.staging_budget = 8u << 20;
  lo.max_read = 1u << 20;
  return lo;
}

struct loaded {
  std::map<std::string, std::string> digests;   // name -> sha256
  load_stats stats;
};

loaded load_s3(const remote_checkpoint& r, const s3::config& cfg, const open_options& oo = {}) {
  const auto ck = checkpoint::open(std::make_shared<s3_catalog>(r.uri(), cfg), oo);
  digest_sink d;
  loaded out;
  out.stats = load(ck, d, small_load());
  for (const auto& [n, g] : d.digests()) out.digests[n] = g.sha256;
  return out;
}

std::map<std::string, std::string> load_local(const remote_checkpoint& r, const open_options& oo = {}) {
  digest_sink d;
  (void)load(checkpoint::open(r.dir, oo), d, small_load());
  std::map<std::string, std::string> out;
  for (const auto& [n, g] : d.digests()) out[n] = g.sha256;
  return out;
}

// The cache's entry of object `name` as the loads key it.
std::shared_ptr<cache::entry> entry_of(cache::block_cache& c, const logged& l, const remote_checkpoint& r,
                                       const std::string& name) {
  return c.open({s3::http_endpoint::parse(l.proxy.endpoint).url(), r.bucket, "ck/" + name, r.etags.at(name),
                 fs::file_size(r.dir / name)});
}

std::vector<fs::path> files_named(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path());
  return out;
}

std::uint64_t block_file_bytes(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".blk") n += fs::file_size(e.path());
  return n;
}

// Runs `body` in a forked child: its result is the exit code (3 for an
// exception, named on stderr).
pid_t in_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 3;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
  }
  ::_exit(code);
}

// The child's wait status.
int reaped(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

// The shards (not the index) with at least `n` blocks.
std::vector<std::string> shards_with_blocks(const remote_checkpoint& r, std::uint64_t n) {
  std::vector<std::string> out;
  for (const auto& s : r.layout.shards)
    if (fs::file_size(r.dir / s.name) >= n * block) out.push_back(s.name);
  return out;
}

}  // namespace

TEST_CASE("a second load of an S3 checkpoint through the cache sends no GET for object bytes, only the listing",
          "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  const auto want = load_local(r);

  const auto first = load_s3(r, l.cfg(cache_dir));
  REQUIRE(first.digests == want);
  const auto gets = block_gets(l.requests(0, r.bucket), r);
  // Every block of every object fetched once (headers, index, tensors), as whole blocks.
  CHECK(gets.size() == r.blocks());
  CHECK(std::set<std::string>(gets.begin(), gets.end()).size() == gets.size());
  // (The headers' speculative 1 MiB reads brought these small shards whole.)
  CHECK(first.stats.cache_hit_bytes + first.stats.cache_fetched_bytes >= first.stats.bytes_read);
  // Blocks of 0600 in a directory of 0700.
  struct stat st{};
  REQUIRE(::stat(cache_dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  const auto blks = files_named(cache_dir, "0.blk");
  REQUIRE(!blks.empty());
  REQUIRE(::stat(blks.front().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  const auto mark = l.lines();
  const auto second = load_s3(r, l.cfg(cache_dir));
  CHECK(second.digests == want);
  const auto again = l.requests(mark, r.bucket);
  INFO("requests of the second load: " << again.size());
  CHECK(block_gets(again, r).empty());
  REQUIRE(again.size() == 1);   // the listing
  CHECK(again.front().key.empty());
  CHECK(second.stats.cache_fetched_bytes == 0);
  CHECK(second.stats.cache_hit_bytes >= second.stats.bytes_read);
  CHECK(l.warnings.empty());
}

TEST_CASE("an object rewritten in S3 between loads is fetched again and its old blocks are never served",
          "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  REQUIRE(load_s3(r, l.cfg(cache_dir)).digests == load_local(r));

  // Same size, other bytes: a new ETag; the old version's blocks would still
  // verify against their own hashes, so only the identity keeps them out.
  const auto victim = shards_with_blocks(r, 2).front();
  auto body = file_bytes(r.dir / victim);
  for (std::size_t i = body.size() / 2; i < body.size(); i += 97) body[i] = ~body[i];
  const auto old_etag = r.etags.at(victim);
  r.rewrite(victim, body);
  REQUIRE(r.etags.at(victim) != old_etag);

  const auto mark = l.lines();
  const auto got = load_s3(r, l.cfg(cache_dir));
  CHECK(got.digests == load_local(r));   // the new bytes
  const auto gets = block_gets(l.requests(mark, r.bucket), r);
  CHECK(gets.size() == (body.size() + block - 1) / block);
  for (const auto& g : gets) CHECK(g.starts_with("ck/" + victim + "@"));
  // The old version is gone from the cache (the load that pinned the new one removed it).
  const auto entries = files_named(cache_dir, "identity");
  std::size_t versions_of_victim = 0;
  for (const auto& p : entries) {
    std::ifstream in(p);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("ck/" + victim) != std::string::npos) ++versions_of_victim;
  }
  CHECK(versions_of_victim == 1);
}

TEST_CASE("a flipped byte, a truncated block and a block of another object are detected, fetched again and counted",
          "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  const auto want = load_local(r);
  REQUIRE(load_s3(r, l.cfg(cache_dir)).digests == want);

  const auto big = shards_with_blocks(r, 2);
  REQUIRE(big.size() >= 2);
  // The process's cache (the one the loads use: their counters).
  const auto c = cache::block_cache::shared(l.cfg(cache_dir).cache);
  auto a = entry_of(*c, l, r, big[0]);
  auto b = entry_of(*c, l, r, big[1]);
  REQUIRE(a);
  REQUIRE(b);
  {  // a flipped byte in block 1 of the first
    std::fstream blk(a->block_path(1), std::ios::in | std::ios::out | std::ios::binary);
    blk.seekg(1000);
    char ch = 0;
    blk.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x10);
    blk.seekp(1000);
    blk.write(&ch, 1);
  }
  fs::resize_file(b->block_path(0), block / 2);   // block 0 of the second cut short
  fs::copy_file(a->block_path(0), b->block_path(1), fs::copy_options::overwrite_existing);   // another object's block
  ::chmod(b->block_path(1).c_str(), 0600);

  const auto mark = l.lines();
  const auto got = load_s3(r, l.cfg(cache_dir));
  CHECK(got.digests == want);
  auto gets = block_gets(l.requests(mark, r.bucket), r);
  std::sort(gets.begin(), gets.end());
  std::vector<std::string> expected{"ck/" + big[0] + "@1", "ck/" + big[1] + "@0", "ck/" + big[1] + "@1"};
  std::sort(expected.begin(), expected.end());
  CHECK(gets == expected);
  CHECK(c->stats().refetched_bytes == 3 * block);
  CHECK(c->stats().bad_blocks == 3);
  // Reported, naming the block's file and what was wrong.
  std::string all;
  for (const auto& w : l.warnings) all += w + "\n";
  INFO(all);
  CHECK(all.find(a->block_path(1)) != std::string::npos);
  CHECK(all.find("hash") != std::string::npos);
  CHECK(all.find(b->block_path(0)) != std::string::npos);
  CHECK(all.find("holds") != std::string::npos);
  CHECK(all.find("another version") != std::string::npos);

  // And a third load is clean again.
  const auto mark3 = l.lines();
  CHECK(load_s3(r, l.cfg(cache_dir)).digests == want);
  CHECK(block_gets(l.requests(mark3, r.bucket), r).empty());
}

TEST_CASE("a load killed mid-write leaves nothing a later load serves, and the later load fetches only what is missing",
          "[source][s3][cache][fault]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  const auto want = load_local(r);

  // A child process loads and kills itself half-way through writing its 6th block.
  const int status = reaped(in_child([&] {
    ::setenv("SLUICE_TEST_FAULT", "cache-write:5:KILL", 1);
    (void)load_s3(r, l.cfg(cache_dir));
    return 0;   // not killed: the test fails below
  }));
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  // The block it was writing is a temporary file; at most 5 were written
  // whole. Blocks 0-4 had each passed the same point, but as many of them as
  // the cache's other worker threads may still have been writing (on a busy
  // machine: 3 of 5 whole in one CI run with 4 workers), so at least
  // 5 - (workers - 1) were whole.
  CHECK(!files_named(cache_dir, "tmp.").empty());
  std::uint64_t whole = 0;
  for (const auto& p : files_named(cache_dir, "")) whole += p.extension() == ".blk";
  CHECK(whole <= 5);
  CHECK(whole + (cache::block_cache::worker_threads - 1) >= 5);

  // The killed child's GETs still in flight when it died (its open asks for
  // every header at once) can reach the proxy's log after the child is
  // gone. A request of this process's, answered, is logged after them (the
  // proxy reads what the child sent, before it died, before what is sent
  // after), so the later load's requests are the lines after it.
  {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), sluice_test::test_config(l.proxy.endpoint));
    CHECK_THROWS_AS(run_blocking(ioc, c.head(r.bucket, "ck/no-such-object")), s3_not_found_error);
  }
  const auto mark = l.lines();
  const auto got = load_s3(r, l.cfg(cache_dir));
  CHECK(got.digests == want);
  const auto gets = block_gets(l.requests(mark, r.bucket), r);
  CHECK(gets.size() == r.blocks() - whole);
  CHECK(std::set<std::string>(gets.begin(), gets.end()).size() == gets.size());
  CHECK(files_named(cache_dir, "tmp.").empty());   // its writer's leftover removed
}

TEST_CASE("two processes loading the same checkpoint at once fetch each block once", "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  const auto want = load_local(r);
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) pids.push_back(in_child([&] { return load_s3(r, l.cfg(cache_dir)).digests == want ? 0 : 2; }));
  for (auto pid : pids) {
    const int status = reaped(pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const auto gets = block_gets(l.requests(0, r.bucket), r);
  CHECK(gets.size() == r.blocks());
  CHECK(std::set<std::string>(gets.begin(), gets.end()).size() == gets.size());
}

TEST_CASE("a partial first load (the draft shards) then a full one: GETs only for blocks not cached, none twice",
          "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  open_options draft;
  const auto prefix = fmt::format("model.layers.{}.", model().layers);
  draft.select = [&](std::string_view n) { return n.starts_with(prefix); };
  const auto first = load_s3(r, l.cfg(cache_dir), draft);
  CHECK(first.digests == load_local(r, draft));
  const auto mark = l.lines();
  const auto full = load_s3(r, l.cfg(cache_dir));
  CHECK(full.digests == load_local(r));
  auto gets = block_gets(l.requests(0, r.bucket), r);
  CHECK(std::set<std::string>(gets.begin(), gets.end()).size() == gets.size());   // none twice
  const auto first_gets = block_gets(l.requests(0, r.bucket), r).size() - block_gets(l.requests(mark, r.bucket), r).size();
  CHECK(first_gets > 0);
  CHECK(first_gets < r.blocks());
  CHECK(gets.size() == r.blocks());
}

TEST_CASE("the cache's cap holds, and eviction spares a block in use", "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  fixture f;
  auto& [r, l, cache_dir] = f;
  const std::uint64_t cap = 6 * (block + cache::block_trailer::size);
  CHECK(load_s3(r, l.cfg(cache_dir, cap)).digests == load_local(r));
  CHECK(block_file_bytes(cache_dir) <= cap);
  CHECK(block_file_bytes(cache_dir) > 0);

  // A reader holds a block (its shared lock): trimming to nothing spares it.
  cache::block_cache c(l.cfg(cache_dir, cap).cache);
  std::shared_ptr<cache::entry> held;
  std::uint64_t index = 0;
  for (const auto& s : r.layout.shards) {
    auto e = entry_of(c, l, r, s.name);
    for (std::uint64_t b = 0; e && b < e->block_count() && !held; ++b)
      if (fs::exists(e->block_path(b))) held = e, index = b;
  }
  REQUIRE(held);
  {
    auto lock = held->try_lock(index, false);
    REQUIRE(lock);
    c.trim(0);
    CHECK(fs::exists(held->block_path(index)));
    CHECK(block_file_bytes(cache_dir) == fs::file_size(held->block_path(index)));
  }
  c.trim(0);
  CHECK(block_file_bytes(cache_dir) == 0);

  // A dead writer's temporary file goes with the next trim, a live writer's stays.
  const auto leftover = held->dir() + "/tmp." + std::to_string(index) + ".999999.0";
  std::ofstream(leftover) << "partial";
  {
    auto writing = held->try_lock(index, true);
    REQUIRE(writing);
    c.trim(0);
    CHECK(fs::exists(leftover));
  }
  c.trim(0);
  CHECK_FALSE(fs::exists(leftover));
}

TEST_CASE("a cache directory or file others can reach is refused, naming it", "[source][s3][cache]") {
  REQUIRE_S3_SERVERS();
  const remote_checkpoint r;
  logged l;
  const scratch open_root{"s3-cache-open"};
  const auto open_dir = open_root.path() / "cache";
  fs::create_directories(open_dir);
  ::chmod(open_dir.c_str(), 0755);
  try {
    (void)load_s3(r, l.cfg(open_dir));
    FAIL("a 0755 cache directory was accepted");
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains(open_dir.string()) && Catch::Contains("chmod 700"));
  }
  CHECK(l.lines() == 0);   // refused before any request

  const scratch cache_root{"s3-cache-c"};
  const auto cache_dir = cache_root.path() / "cache";
  REQUIRE(load_s3(r, l.cfg(cache_dir)).digests == load_local(r));
  const auto blk = files_named(cache_dir, "1.blk").front();
  ::chmod(blk.c_str(), 0644);
  try {
    (void)load_s3(r, l.cfg(cache_dir));
    FAIL("a 0644 block file was served");
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains(blk.string()) && Catch::Contains("0644"));
  }
}

TEST_CASE("an identity file that is not the object's (or too large to be one) keeps its blocks unserved",
          "[source][cache]") {
  const scratch root{"s3-cache-ident"};
  const auto dir = root.path() / "cache";
  std::vector<std::string> warnings;
  cache::options o;
  o.dir = dir.string();
  o.block_size = 4096;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  cache::block_cache c(o);
  const cache::object_id id{"http://127.0.0.1:1", "b", "k", "\"etag\"", 10000};
  auto e = c.open(id);
  REQUIRE(e);
  std::vector<std::byte> bytes(4096, std::byte{7});
  {
    auto lock = e->try_lock(0, true);
    REQUIRE(e->publish(0, bytes, e->hash(bytes)));
  }
  // Served as written.
  std::string why;
  auto f = e->open_block(0, false, why);
  REQUIRE(f);
  // The identity overwritten with 70 KiB: this version is not served any more.
  std::ofstream(e->dir() + "/identity", std::ios::trunc) << std::string(70 << 10, 'x');
  CHECK_FALSE(c.open(id));
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings.front(), Catch::Contains("identity") && Catch::Contains("not served"));
  // An object without an ETag is never cached.
  CHECK_FALSE(c.open({"http://127.0.0.1:1", "b", "k2", "", 10}));
}
