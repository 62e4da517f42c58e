// Tests for include/sluice/s3/client.hpp against the S3 test server (moto) with SigV4
// verification (scripts/s3-server.sh; see s3_test_support.hpp for how the
// servers are found or started) and through the fault proxy.
#include <sluice/s3/client.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <cstring>
#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sluice/core/run.hpp>

#include "s3_test_support.hpp"

using namespace sluice;
using namespace std::chrono_literals;
using sluice_test::servers;

namespace {

task<void> upload(s3::client& c, std::string bucket, std::string key, std::vector<std::byte> data) {
  // Each bucket is created once per process (S3 outside us-east-1 answers 409 to a second create).
  static std::set<std::string> created;
  if (created.insert(bucket).second) co_await c.create_bucket(bucket);
  (void)co_await c.put(bucket, key, data);
}

task<s3::range_result> get(s3::client& c, std::string bucket, std::string key, std::uint64_t off,
                           std::span<std::byte> dst, std::string if_match = {}) {
  co_return co_await c.get_range(std::move(bucket), std::move(key), off, dst, std::move(if_match));
}

// N concurrent range GETs of [i*part, (i+1)*part) into `out`; joins them all.
task<void> parallel_gets(s3::client& c, std::string bucket, std::string key, std::span<std::byte> out,
                         std::size_t part) {
  auto ex = co_await this_executor;
  std::size_t n = (out.size() + part - 1) / part, done = 0;
  std::exception_ptr first;
  asio::steady_timer all_done(ex, asio::steady_timer::time_point::max());
  for (std::size_t i = 0; i < n; ++i) {
    auto dst = out.subspan(i * part, std::min(part, out.size() - i * part));
    asio::co_spawn(ex, get(c, bucket, key, i * part, dst),
                   [&first, &done, &all_done, n, want = dst.size()](std::exception_ptr e, s3::range_result r) {
                     if (!first && e) first = e;
                     if (!e && r.bytes != want && !first)
                       first = std::make_exception_ptr(std::runtime_error("short range GET"));
                     if (++done == n) all_done.cancel();
                   });
  }
  boost::system::error_code ec;
  co_await all_done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (first) std::rethrow_exception(first);
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

TEST_CASE("range GETs return exactly the uploaded bytes over HTTP and HTTPS", "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  const bool https = GENERATE(false, true);
  if (https && servers().https.empty()) {
    WARN("SKIPPED: no HTTPS endpoint");
    return;
  }
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(https ? servers().https : servers().http));
  const auto data = sluice_test::random_bytes((3 << 20) + 17, 42);
  const auto bucket = sluice_test::unique_bucket("range");
  run_blocking(ioc, upload(c, bucket, "dir/model 00001.safetensors", data));

  struct probe {
    std::uint64_t off, len, expect;
  };
  for (auto p : {probe{0, 100, 100}, probe{1, 1, 1}, probe{1000, 1 << 20, 1 << 20},
                 probe{data.size() - 10, 10, 10}, probe{data.size() - 10, 100, 10}, probe{0, data.size(), data.size()},
                 probe{data.size(), 10, 0}, probe{data.size() + 5, 10, 0}}) {
    INFO("offset " << p.off << " length " << p.len << (https ? " https" : " http"));
    std::vector<std::byte> dst(p.len);
    auto r = run_blocking(ioc, get(c, bucket, "dir/model 00001.safetensors", p.off, dst));
    REQUIRE(r.bytes == p.expect);
    CHECK(same(std::span(dst).first(r.bytes), std::span(data).subspan(std::min<std::uint64_t>(p.off, data.size()), r.bytes)));
    if (r.bytes) {
      CHECK(r.object_size == data.size());
      CHECK_FALSE(r.etag.empty());
    }
  }
  CHECK(c.busy_connections() == 0);
  CHECK(c.counters().retries == 0);
}

TEST_CASE("many concurrent range GETs share a bounded pool of keep-alive connections", "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  // Over HTTPS: nginx keeps connections alive there, while moto's own HTTP
  // server (werkzeug) answers every request with Connection: close.
  REQUIRE_FALSE(servers().https.empty());
  asio::io_context ioc;
  auto cfg = sluice_test::test_config(servers().https);
  cfg.max_connections = 3;
  s3::client c(ioc.get_executor(), cfg);
  const auto data = sluice_test::random_bytes(5 << 20, 7);
  const auto bucket = sluice_test::unique_bucket("pool");
  run_blocking(ioc, upload(c, bucket, "obj", data));
  std::vector<std::byte> out(data.size());
  run_blocking(ioc, parallel_gets(c, bucket, "obj", out, 100 * 1024));
  CHECK(same(out, data));
  CHECK(c.busy_connections() == 0);
  CHECK(c.idle_connections() <= 3);
  CHECK(c.idle_connections() >= 1);
  CHECK(c.counters().bytes_read >= data.size());
}

namespace {
task<s3::object_info> head(s3::client& c, std::string b, std::string k) { co_return co_await c.head(b, k); }
task<s3::list_result> list(s3::client& c, std::string b, std::string p, std::string d, unsigned max_keys) {
  co_return co_await c.list(b, p, d, max_keys);
}
}  // namespace

TEST_CASE("HEAD gives size and ETag and listings follow continuation tokens", "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
  const auto bucket = sluice_test::unique_bucket("list");
  std::vector<std::string> keys;
  for (int i = 0; i < 7; ++i) {
    keys.push_back("ckpt/model-0000" + std::to_string(i) + "-of-00007.safetensors");
    run_blocking(ioc, upload(c, bucket, keys.back(), sluice_test::random_bytes(100 + i, i)));
  }
  run_blocking(ioc, upload(c, bucket, "ckpt/sub/nested.bin", sluice_test::random_bytes(5, 1)));
  run_blocking(ioc, upload(c, bucket, "other/x.bin", sluice_test::random_bytes(5, 1)));

  auto info = run_blocking(ioc, head(c, bucket, keys[3]));
  CHECK(info.size == 103);
  CHECK(info.etag.size() > 2);

  auto all = run_blocking(ioc, list(c, bucket, "ckpt/", "", 2));
  CHECK(all.pages >= 4);
  REQUIRE(all.objects.size() == 8);
  CHECK(all.objects[0].key == keys[0]);
  CHECK(all.objects[6].size == 106);

  auto flat = run_blocking(ioc, list(c, bucket, "ckpt/", "/", 1000));
  CHECK(flat.objects.size() == 7);
  REQUIRE(flat.common_prefixes.size() == 1);
  CHECK(flat.common_prefixes[0] == "ckpt/sub/");
}

TEST_CASE("a wrong secret is a typed SignatureDoesNotMatch error that names everything and is not retried",
          "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  s3::client good(ioc.get_executor(), sluice_test::test_config(servers().http));
  const auto bucket = sluice_test::unique_bucket("sig");
  run_blocking(ioc, upload(good, bucket, "k.bin", sluice_test::random_bytes(1000, 3)));

  s3::client bad(ioc.get_executor(), sluice_test::test_config(servers().http, "wrong-secret"));
  std::vector<std::byte> dst(100);
  try {
    (void)run_blocking(ioc, get(bad, bucket, "k.bin", 0, dst));
    FAIL("a wrong secret was accepted");
  } catch (const s3_access_error& e) {
    std::string what = e.what();
    INFO(what);
    CHECK(e.s3_code() == "SignatureDoesNotMatch");
    CHECK(e.http_status() == 403);
    CHECK(e.attempts() == 1);
    CHECK(what.find(servers().http) != std::string::npos);
    CHECK(what.find(bucket) != std::string::npos);
    CHECK(what.find("k.bin") != std::string::npos);
    CHECK(what.find("bytes=0-99") != std::string::npos);
    CHECK(what.find("HTTP 403") != std::string::npos);
    CHECK(what.find("attempt 1 of 4") != std::string::npos);
    CHECK(e.file() == "s3://" + bucket + "/k.bin");
  }
  CHECK(bad.counters().requests == 1);
  CHECK(bad.counters().retries == 0);
}

TEST_CASE("a missing key or bucket is a typed not-found error and is not retried", "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
  const auto bucket = sluice_test::unique_bucket("nf");
  run_blocking(ioc, upload(c, bucket, "exists", sluice_test::random_bytes(10, 1)));
  std::vector<std::byte> dst(10);
  CHECK_THROWS_AS(run_blocking(ioc, get(c, bucket, "missing", 0, dst)), s3_not_found_error);
  CHECK_THROWS_WITH(run_blocking(ioc, get(c, bucket, "missing", 0, dst)), Catch::Contains("NoSuchKey"));
  CHECK_THROWS_AS(run_blocking(ioc, head(c, bucket, "missing")), s3_not_found_error);
  CHECK_THROWS_WITH(run_blocking(ioc, list(c, "no-such-bucket-sluice", "", "", 10)), Catch::Contains("NoSuchBucket"));
  CHECK_THROWS_AS(run_blocking(ioc, get(c, "no-such-bucket-sluice", "k", 0, dst)), s3_not_found_error);
  CHECK(c.counters().retries == 0);
}

TEST_CASE("an object replaced during a load fails with s3_object_changed_error", "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
  const auto bucket = sluice_test::unique_bucket("etag");
  run_blocking(ioc, upload(c, bucket, "shard", sluice_test::random_bytes(4096, 1)));
  auto pinned = run_blocking(ioc, head(c, bucket, "shard"));
  std::vector<std::byte> dst(100);
  CHECK(run_blocking(ioc, get(c, bucket, "shard", 0, dst, pinned.etag)).bytes == 100);
  run_blocking(ioc, upload(c, bucket, "shard", sluice_test::random_bytes(4096, 2)));
  CHECK_THROWS_AS(run_blocking(ioc, get(c, bucket, "shard", 100, dst, pinned.etag)), s3_object_changed_error);
  CHECK_THROWS_WITH(run_blocking(ioc, get(c, bucket, "shard", 100, dst, pinned.etag)), Catch::Contains("ETag"));
}

TEST_CASE("HTTPS verifies the certificate: an untrusted server fails the handshake without retries",
          "[source][s3][client]") {
  REQUIRE_S3_SERVERS();
  if (servers().https.empty()) {
    WARN("SKIPPED: no HTTPS endpoint");
    return;
  }
  asio::io_context ioc;
  auto cfg = sluice_test::test_config(servers().https);
  cfg.ca_bundle.clear();   // the system store does not trust the self-signed test certificate
  s3::client c(ioc.get_executor(), cfg);
  std::vector<std::byte> dst(10);
  try {
    (void)run_blocking(ioc, get(c, "any", "k", 0, dst));
    FAIL("an untrusted certificate was accepted");
  } catch (const s3_error& e) {
    INFO(e.what());
    CHECK(e.s3_code() == "TLSHandshakeFailed");
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find("AWS_CA_BUNDLE") != std::string::npos);
  }
}

// ---- fault injection ----------------------------------------------------------

namespace {
struct fault_case {
  const char* fault;
  int every;
};
}  // namespace

TEST_CASE("transient faults are retried and resumed: the bytes come back identical", "[source][s3][client][faults]") {
  REQUIRE_S3_SERVERS();
  auto fc = GENERATE(fault_case{"503", 2}, fault_case{"drop", 2}, fault_case{"reset", 2}, fault_case{"truncate", 2},
                     fault_case{"stall", 2}, fault_case{"stall-header", 2}, fault_case{"truncate", 3});
  INFO("fault " << fc.fault << " every " << fc.every);
  asio::io_context ioc;
  const auto data = sluice_test::random_bytes(3 << 20, 11);
  const auto bucket = sluice_test::unique_bucket("fault");
  {
    s3::client direct(ioc.get_executor(), sluice_test::test_config(servers().http));
    run_blocking(ioc, upload(direct, bucket, "obj", data));
  }
  sluice_test::fault_proxy proxy(servers().http, fc.fault, fc.every);
  auto cfg = sluice_test::test_config(proxy.endpoint);
  cfg.low_speed_window = 1s;
  cfg.retry.max_attempts = 6;
  s3::client c(ioc.get_executor(), cfg);
  std::vector<std::byte> out(data.size());
  run_blocking(ioc, parallel_gets(c, bucket, "obj", out, 1 << 20));
  CHECK(same(out, data));
  CHECK(c.counters().retries > 0);
  CHECK(c.busy_connections() == 0);
}

TEST_CASE("persistent faults fail with a clear error after the last attempt", "[source][s3][client][faults]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  const auto bucket = sluice_test::unique_bucket("persist");
  {
    s3::client direct(ioc.get_executor(), sluice_test::test_config(servers().http));
    run_blocking(ioc, upload(direct, bucket, "obj", sluice_test::random_bytes(1 << 20, 5)));
  }
  SECTION("503 SlowDown on every attempt") {
    sluice_test::fault_proxy proxy(servers().http, "503", 1);
    auto cfg = sluice_test::test_config(proxy.endpoint);
    cfg.retry.max_attempts = 3;
    s3::client c(ioc.get_executor(), cfg);
    std::vector<std::byte> dst(1000);
    try {
      (void)run_blocking(ioc, get(c, bucket, "obj", 0, dst));
      FAIL("no error");
    } catch (const s3_error& e) {
      std::string what = e.what();
      INFO(what);
      CHECK(e.s3_code() == "SlowDown");
      CHECK(e.http_status() == 503);
      CHECK(what.find("attempt 3 of 3") != std::string::npos);
      CHECK(what.find("bytes=0-999") != std::string::npos);
    }
    CHECK(c.counters().requests == 3);
  }
  SECTION("a stall on every attempt ends within the low-speed windows") {
    sluice_test::fault_proxy proxy(servers().http, "stall-header", 1);
    auto cfg = sluice_test::test_config(proxy.endpoint);
    cfg.retry.max_attempts = 2;
    cfg.low_speed_window = 500ms;
    s3::client c(ioc.get_executor(), cfg);
    std::vector<std::byte> dst(1000);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(run_blocking(ioc, get(c, bucket, "obj", 0, dst)),
                      Catch::Contains("Timeout") && Catch::Contains("attempt 2 of 2"));
    CHECK(std::chrono::steady_clock::now() - start < 20s);   // bounded, not a wall-clock assertion of speed
  }
}

// ---- unexpected response bodies (the fault proxy's canned answers) ------------

TEST_CASE("a listing that is not valid ListObjectsV2 XML is a typed MalformedResponse error, not a crash",
          "[source][s3][client][xml]") {
  REQUIRE_S3_SERVERS();
  struct bad_case {
    const char* body;
    const char* says;
  };
  const auto bc = GENERATE(
      bad_case{"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><Si", "not well-formed XML"},
      bad_case{"upstream connect error", "not well-formed XML"},
      bad_case{"<ListBucketResult><Contents><Key>a</Key></Contents></ListBucketResult>", "has no <Size>"},
      bad_case{"<html><body>hello</body></html>", "root element is <html>"});
  INFO("body: " << bc.body);
  auto proxy = sluice_test::fault_proxy::canned(200, bc.body);
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(proxy.endpoint));
  try {
    (void)run_blocking(ioc, list(c, "bucket", "ckpt/", "", 1000));
    FAIL("a malformed listing was accepted");
  } catch (const s3_error& e) {
    INFO(e.what());
    CHECK(e.s3_code() == "MalformedResponse");
    CHECK(e.http_status() == 200);
    CHECK_THAT(e.what(), Catch::Contains("S3 ListObjectsV2 failed") && Catch::Contains("page 1 of the listing") &&
                             Catch::Contains(bc.says) && Catch::Contains("bucket bucket"));
  }
}

TEST_CASE("entity-escaped keys in a listing come back decoded", "[source][s3][client][xml]") {
  REQUIRE_S3_SERVERS();
  auto proxy = sluice_test::fault_proxy::canned(
      200, "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><IsTruncated>false</IsTruncated>"
           "<Contents><Key>ckpt/a&amp;b &lt;1&gt;.safetensors</Key><Size>42</Size><ETag>&quot;e&quot;</ETag></Contents>"
           "</ListBucketResult>");
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(proxy.endpoint));
  auto r = run_blocking(ioc, list(c, "bucket", "ckpt/", "", 1000));
  REQUIRE(r.objects.size() == 1);
  CHECK(r.objects[0].key == "ckpt/a&b <1>.safetensors");
  CHECK(r.objects[0].size == 42);
  CHECK(r.objects[0].etag == "\"e\"");
}

TEST_CASE("keys with XML special characters round-trip through a real listing", "[source][s3][client][xml]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), sluice_test::test_config(servers().http));
  const auto bucket = sluice_test::unique_bucket("xmlkeys");
  run_blocking(ioc, upload(c, bucket, "ckpt/a&b'c\".bin", sluice_test::random_bytes(3, 1)));
  auto r = run_blocking(ioc, list(c, bucket, "ckpt/", "", 1000));
  REQUIRE(r.objects.size() == 1);
  CHECK(r.objects[0].key == "ckpt/a&b'c\".bin");
  CHECK(r.objects[0].size == 3);
}

TEST_CASE("error bodies: S3 documents give code and message, anything else falls back to the status, quoted",
          "[source][s3][client][xml]") {
  REQUIRE_S3_SERVERS();
  asio::io_context ioc;
  std::vector<std::byte> dst(10);
  SECTION("an escaped message is decoded") {
    auto proxy = sluice_test::fault_proxy::canned(
        404, "<Error><Code>NoSuchKey</Code><Message>no key &apos;a&amp;b&apos;</Message></Error>");
    s3::client c(ioc.get_executor(), sluice_test::test_config(proxy.endpoint));
    CHECK_THROWS_AS(run_blocking(ioc, get(c, "bucket", "a&b", 0, dst)), s3_not_found_error);
    CHECK_THROWS_WITH(run_blocking(ioc, get(c, "bucket", "a&b", 0, dst)),
                      Catch::Contains("HTTP 404 NoSuchKey: no key 'a&b'"));
  }
  SECTION("a truncated error document") {
    auto proxy = sluice_test::fault_proxy::canned(403, "<Error><Code>AccessDenied</Code><Mess");
    s3::client c(ioc.get_executor(), sluice_test::test_config(proxy.endpoint));
    CHECK_THROWS_AS(run_blocking(ioc, get(c, "bucket", "k", 0, dst)), s3_access_error);
    CHECK_THROWS_WITH(run_blocking(ioc, get(c, "bucket", "k", 0, dst)),
                      Catch::Contains("HTTP 403 AccessDenied: unexpected response body: <Error><Code>AccessDenied"));
  }
  SECTION("an HTML page from a proxy, retried as a 502") {
    auto proxy = sluice_test::fault_proxy::canned(502, "<html>\n<body>Bad Gateway</body>\n</html>");
    auto cfg = sluice_test::test_config(proxy.endpoint);
    cfg.retry.max_attempts = 2;
    s3::client c(ioc.get_executor(), cfg);
    CHECK_THROWS_WITH(run_blocking(ioc, head(c, "bucket", "k")), Catch::Contains("HTTP 502 HTTP502") &&
                                                                     Catch::Contains("attempt 2 of 2"));
    CHECK_THROWS_WITH(run_blocking(ioc, get(c, "bucket", "k", 0, dst)),
                      Catch::Contains("unexpected response body: <html> <body>Bad Gateway</body> </html>"));
  }
}
