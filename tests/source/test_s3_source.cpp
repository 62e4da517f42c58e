// Tests for include/sluice/s3/source.hpp (s3_source, s3_catalog) against
// the S3 test server (moto, SigV4 checked; see s3_test_support.hpp).
#include <sluice/load_file.hpp>
#include <sluice/source/any_source.hpp>
#include <sluice/s3/source.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sluice/sink/discard_sink.hpp>
#include <sluice/testing/generator.hpp>

#include "s3_test_support.hpp"
#include "support/coro.hpp"

using namespace sluice;
using sluice_test::servers;

namespace {

task<void> upload_all(s3::client& c, std::string bucket, std::map<std::string, std::vector<std::byte>> objects) {
  co_await c.create_bucket(bucket);
  for (const auto& [key, data] : objects) (void)co_await c.put(bucket, key, data);
}

// A checkpoint-like set of objects under "ckpt/": shards, an index, a nested dir.
std::map<std::string, std::vector<std::byte>> checkpoint_objects() {
  std::map<std::string, std::vector<std::byte>> m;
  m["ckpt/model-00001-of-00003.safetensors"] = sluice_test::random_bytes((2 << 20) + 3, 1);
  m["ckpt/model-00002-of-00003.safetensors"] = sluice_test::random_bytes(300'000, 2);
  m["ckpt/model-00003-of-00003.safetensors"] = sluice_test::random_bytes(5, 3);
  m["ckpt/model.safetensors.index.json"] = sluice_test::random_bytes(1000, 4);
  m["ckpt/extra/ignored.bin"] = sluice_test::random_bytes(10, 5);
  return m;
}

task<std::size_t> read_one(s3_source& src, std::uint32_t file, std::uint64_t off, std::span<std::byte> dst) {
  co_return co_await src.read_at(file, off, dst);
}

// Reads every file of `src` in `part`-sized pieces, all concurrently.
task<void> read_everything(s3_source& src, std::vector<std::vector<std::byte>>& out, std::size_t part) {
  auto ex = co_await this_executor;
  std::size_t pending = 0, done = 0;
  std::exception_ptr first;
  asio::steady_timer all_done(ex, asio::steady_timer::time_point::max());
  for (std::uint32_t f = 0; f < out.size(); ++f)
    for (std::size_t off = 0; off < out[f].size(); off += part) ++pending;
  for (std::uint32_t f = 0; f < out.size(); ++f) {
    for (std::size_t off = 0; off < out[f].size(); off += part) {
      auto dst = std::span(out[f]).subspan(off, std::min(part, out[f].size() - off));
      asio::co_spawn(ex, read_one(src, f, off, dst),
                     [&first, &done, &all_done, pending, want = dst.size()](std::exception_ptr e, std::size_t n) {
                       if (e && !first) first = e;
                       if (!e && n != want && !first) first = std::make_exception_ptr(std::runtime_error("short read"));
                       if (++done == pending) all_done.cancel();
                     });
    }
  }
  boost::system::error_code ec;
  if (pending) co_await all_done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (first) std::rethrow_exception(first);
}

task<std::string> put_one(std::shared_ptr<s3::client> c, std::string bucket, std::string key,
                          std::vector<std::byte> data) {
  co_return co_await c->put(bucket, key, data);
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TEST_CASE("s3_source models the source concept", "[source][s3]") { STATIC_REQUIRE(source<s3_source>); }

TEST_CASE("the catalog lists, sizes and reads the objects under an s3:// prefix", "[source][s3][catalog]") {
  REQUIRE_S3_SERVERS();
  const auto objects = checkpoint_objects();
  const auto bucket = sluice_test::unique_bucket("catalog");
  {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
    run_blocking(ioc, upload_all(c, bucket, objects));
  }
  s3_catalog cat("s3://" + bucket + "/ckpt", sluice_test::test_config(servers().http));
  CHECK(cat.location() == "s3://" + bucket + "/ckpt/");
  CHECK(cat.uri("a.safetensors") == "s3://" + bucket + "/ckpt/a.safetensors");
  CHECK(cat.list() == std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                               "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  CHECK(cat.exists("model-00002-of-00003.safetensors"));
  CHECK_FALSE(cat.exists("nope.safetensors"));
  CHECK(cat.size("model-00002-of-00003.safetensors") == 300'000);
  CHECK_THROWS_AS(cat.size("nope.safetensors"), io_error);

  const auto& shard1 = objects.at("ckpt/model-00001-of-00003.safetensors");
  SECTION("read_prefix makes one speculative GET and serves later header reads from it") {
    const auto before = cat.counters().requests.load();
    auto head8 = cat.read_prefix("model-00001-of-00003.safetensors", 8);
    CHECK(same(head8, std::span(shard1).first(8)));
    auto header = cat.read("model-00001-of-00003.safetensors", 8, 4000);
    CHECK(same(header, std::span(shard1).subspan(8, 4000)));
    CHECK(cat.counters().requests.load() == before + 1);
    // Beyond the speculative megabyte: a second GET.
    auto far = cat.read("model-00001-of-00003.safetensors", 2 << 20, 100);
    CHECK(same(far, std::span(shard1).subspan(2 << 20, 3)));   // short only at the end of the object
    CHECK(cat.counters().requests.load() == before + 2);
  }
  SECTION("a small object is read whole by read_prefix") {
    auto all = cat.read_prefix("model-00003-of-00003.safetensors", 8);
    CHECK(all.size() == 5);
    CHECK(cat.read("model-00003-of-00003.safetensors", 2, 100).size() == 3);
  }
}

TEST_CASE("s3_source reads every byte of every shard, concurrently, identical to what was uploaded",
          "[source][s3]") {
  REQUIRE_S3_SERVERS();
  const bool https = GENERATE(false, true);
  if (https && servers().https.empty()) {
    WARN("SKIPPED: no HTTPS endpoint");
    return;
  }
  const auto objects = checkpoint_objects();
  const auto bucket = sluice_test::unique_bucket("source");
  asio::io_context ioc;
  auto cfg = sluice_test::test_config(https ? servers().https : servers().http);
  {
    s3::client c(ioc.get_executor(), cfg);
    run_blocking(ioc, upload_all(c, bucket, objects));
  }
  s3_catalog cat("s3://" + bucket + "/ckpt/", cfg);
  auto names = cat.list();
  std::vector<std::string> uris;
  for (auto& n : names) uris.push_back(cat.uri(n));
  s3_source src(ioc.get_executor(), cfg, uris);
  for (std::uint32_t i = 0; i < names.size(); ++i) src.pin(i, cat.object_info(names[i]));   // the catalog's versions
  CHECK(src.file_count() == 4);
  CHECK(src.file_uri(1) == "s3://" + bucket + "/ckpt/model-00002-of-00003.safetensors");

  std::vector<std::vector<std::byte>> out;
  for (auto& n : names) out.emplace_back(*src.file_size(static_cast<std::uint32_t>(&n - names.data())));
  run_blocking(ioc, read_everything(src, out, 256 * 1024));
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    CHECK(same(out[i], objects.at("ckpt/" + names[i])));
  }
  std::vector<std::byte> tail(10);
  CHECK(run_blocking(ioc, read_one(src, 2, 5, tail)) == 0);   // at the end
  CHECK(run_blocking(ioc, read_one(src, 2, 3, tail)) == 2);   // short at the end
  CHECK(src.counters().bytes_read > 2'000'000);
  CHECK(src.client().busy_connections() == 0);
}

TEST_CASE("s3_source heads lazily and fails clearly when a shard changes or is missing", "[source][s3]") {
  REQUIRE_S3_SERVERS();
  const auto bucket = sluice_test::unique_bucket("lazy");
  asio::io_context ioc;
  auto cfg = sluice_test::test_config(servers().http);
  auto c = std::make_shared<s3::client>(ioc.get_executor(), cfg);
  run_blocking(ioc, upload_all(*c, bucket, {{"a", sluice_test::random_bytes(1000, 1)}}));
  s3_source src(c, {"s3://" + bucket + "/a", "s3://" + bucket + "/missing"});
  std::vector<std::byte> dst(100);
  CHECK(run_blocking(ioc, read_one(src, 0, 0, dst)) == 100);
  CHECK(src.counters().files_opened == 1);
  CHECK_THROWS_AS(run_blocking(ioc, read_one(src, 1, 0, dst)), s3_not_found_error);
  (void)run_blocking(ioc, put_one(c, bucket, "a", sluice_test::random_bytes(1000, 2)));   // replaced
  CHECK_THROWS_AS(run_blocking(ioc, read_one(src, 0, 100, dst)), s3_object_changed_error);
}

TEST_CASE("the configuration from AWS environment variables reaches the HTTPS server", "[source][s3][config]") {
  REQUIRE_S3_SERVERS();
  if (servers().https.empty()) {
    WARN("SKIPPED: no HTTPS endpoint");
    return;
  }
  std::map<std::string, std::string> env{{"HOME", "/nonexistent"},
                                         {"AWS_ACCESS_KEY_ID", servers().access_key_id},
                                         {"AWS_SECRET_ACCESS_KEY", servers().secret_access_key},
                                         {"AWS_ENDPOINT_URL_S3", servers().https},
                                         {"AWS_CA_BUNDLE", servers().ca_bundle}};
  auto cfg = s3::config::from_environment([&env](const std::string& n) -> std::optional<std::string> {
    auto it = env.find(n);
    return it == env.end() ? std::nullopt : std::optional(it->second);
  });
  CHECK(cfg.use_path_style("bucket"));
  const auto bucket = sluice_test::unique_bucket("envcfg");
  {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), cfg);
    run_blocking(ioc, upload_all(c, bucket, {{"p/x.bin", sluice_test::random_bytes(10, 1)}}));
  }
  s3_catalog cat("s3://" + bucket + "/p/", cfg);
  CHECK(cat.list() == std::vector<std::string>{"x.bin"});
}

namespace {
// Metadata from one catalog, the data path (open_source) from another: a
// checkpoint opened without a stall, loaded through the stalling proxy.
class split_catalog final : public catalog {
 public:
  split_catalog(catalog& meta, catalog& data) : meta_(meta), data_(data) {}
  [[nodiscard]] std::string location() const override { return meta_.location(); }
  [[nodiscard]] std::string uri(const std::string& name) const override { return meta_.uri(name); }
  [[nodiscard]] std::vector<std::string> list() override { return meta_.list(); }
  [[nodiscard]] bool exists(const std::string& name) override { return meta_.exists(name); }
  [[nodiscard]] std::uint64_t size(const std::string& name) override { return meta_.size(name); }
  [[nodiscard]] std::optional<std::string> etag(const std::string& name) override { return meta_.etag(name); }
  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset, std::uint64_t length) override {
    return meta_.read(name, offset, length);
  }
  [[nodiscard]] std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) override {
    return meta_.read_prefix(name, length);
  }
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc, const source_options& opt,
                                                        const reader_sizing& sizing) override {
    return data_.open_source(ck, ioc, opt, sizing);
  }

 private:
  catalog& meta_;
  catalog& data_;
};
}  // namespace

TEST_CASE("a load from S3 stopped while its GETs stall ends promptly, every slot and connection returned",
          "[source][s3][cancel]") {
  REQUIRE_S3_SERVERS();
  const auto bucket = sluice_test::unique_bucket("stop");
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, testing::options_for_size(4u << 20));
  {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
    std::map<std::string, std::vector<std::byte>> objects;
    for (const auto& f : std::filesystem::directory_iterator(dir.path)) {
      std::ifstream in(f.path(), std::ios::binary);
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
      objects["ck/" + f.path().filename().string()] = std::vector<std::byte>(
          reinterpret_cast<const std::byte*>(bytes.data()), reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
    }
    run_blocking(ioc, upload_all(c, bucket, objects));
  }
  // Opened directly; the data path goes through a proxy whose range GETs send
  // nothing for a minute (the low-speed window is 10 s, retries 4).
  s3_catalog direct("s3://" + bucket + "/ck/", sluice_test::test_config(servers().http));
  sluice_test::fault_proxy proxy(servers().http, "stall-header", 1);
  s3_catalog stalled("s3://" + bucket + "/ck/", sluice_test::test_config(proxy.endpoint));
  (void)stalled.list();  // sizes and ETags (not range GETs: not stalled)
  const auto ck = checkpoint::open(std::make_shared<split_catalog>(direct, stalled));
  std::stop_source stop;
  load_options opt;
  opt.staging_budget = 16u << 20;
  opt.max_read = 1u << 20;
  opt.stop = stop.get_token();
  staging_pool pool({opt.staging_budget, slot_size_for(opt.max_read), opt.poison});
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop.request_stop();
  });
  discard_sink sink;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(load(ck, sink, pool, opt), cancelled_error);  // through the data path of the stalled catalog
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stopper.join();
  INFO("stopped after " << seconds << " s");
  // Not the 10 s low-speed window (nor its retries): a bound that tells a stop
  // from a stall, with room for a busy machine.
  CHECK(seconds < 8.0);
  CHECK(pool.free_count() == pool.slot_count());
}
