// The HTTP room's client (http/client.hpp) with a store that is not S3: its
// own auth header, its own error bodies, its own typed error; range GETs,
// retries and resumes are the client's. The store is tests/support/http_store.py.
#include <catch2/catch.hpp>

#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <sluice/core/run.hpp>
#include <sluice/error.hpp>
#include <sluice/http/client.hpp>

#include "s3_test_support.hpp"
#include "support/coro.hpp"

using namespace sluice;

namespace {
struct store_error : std::runtime_error {
  using std::runtime_error::runtime_error;
  unsigned attempts = 0;
};

struct store {
  sluice_test::scratch_dir dir;
  std::string log = (dir.path / "requests.jsonl").string();
  sluice_test::child server{{SLUICE_PYTHON3, SLUICE_HTTP_STORE_SCRIPT, log}};
  std::string port = server.read_line();
  std::atomic<int> prepared{0};

  http::client_options options() const {
    http::client_options o;
    o.endpoint = http::endpoint::parse("http://127.0.0.1:" + port);
    o.retry.base_delay = std::chrono::milliseconds(1);
    o.retry.max_attempts = 3;
    return o;
  }
  // The store's hooks: a bearer token, JSON error bodies, its own error type.
  http::request_hooks hooks(std::string path, std::string token = "test-token") {
    http::request_hooks h;
    h.store = "TestStore";
    h.prepare = [this, path, token](const http::request&, const http::header_list& headers, http::wire_request& w) {
      ++prepared;
      w.target = path;
      w.headers = headers;
      w.headers.emplace_back("authorization", "Bearer " + token);
    };
    h.classify = [](const http::request&, const http::response& a) -> std::optional<http::failure> {
      http::failure f;
      f.status = a.status;
      f.code = nlohmann::json::parse(a.body, nullptr, false).value("error", "?");
      f.retryable = http::is_retryable_status(a.status);
      return f;
    };
    h.fail = [](const http::request& r, const http::failure& f, unsigned attempt, std::size_t) {
      store_error e(r.operation + " failed: HTTP " + std::to_string(f.status) + " " + f.code);
      e.attempts = attempt;
      throw e;
    };
    h.describe = [path](const http::request&) { return "object " + path; };
    return h;
  }
  std::vector<nlohmann::json> requests() const {
    std::vector<nlohmann::json> v;
    std::ifstream f(log);
    for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
    return v;
  }
};

std::vector<std::byte> expected(std::size_t from, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(((from + i) * 7 + 3) % 251);
  return v;
}

http::request range_get(std::uint64_t begin, std::vector<std::byte>& dst) {
  http::request r;
  r.operation = "GET";
  r.host = "127.0.0.1";
  r.ranged = true;
  r.begin = begin;
  r.end = begin + dst.size();
  r.dst = dst.data();
  return r;
}
}  // namespace

TEST_CASE("the HTTP client serves a store that is not S3: its hooks sign and read errors, the client retries and resumes",
          "[source][http][client]") {
  store s;
  asio::io_context ioc;
  http::client c(ioc.get_executor(), s.options());
  {  // a range GET with the store's own auth
    std::vector<std::byte> dst(100'000);
    const auto hooks = s.hooks("/obj");
    const auto r = run_blocking(ioc, c.execute(range_get(1234, dst), hooks));
    REQUIRE(r.bytes == dst.size());
    REQUIRE(r.attempts == 1);
    REQUIRE(r.answer.object_size == 300'000);
    REQUIRE(r.answer.etag == "\"v1\"");
    REQUIRE(dst == expected(1234, dst.size()));
    REQUIRE(s.requests().back()["auth"] == "Bearer test-token");
    REQUIRE(s.requests().back()["range"] == "bytes=1234-101233");
  }
  {  // a 503 the store's classify calls retryable: retried, prepared anew
    std::vector<std::byte> dst(5000);
    const int before = s.prepared;
    const auto hooks = s.hooks("/flaky");
    const auto r = run_blocking(ioc, c.execute(range_get(0, dst), hooks));
    REQUIRE(r.attempts == 2);
    REQUIRE(s.prepared - before == 2);
    REQUIRE(dst == expected(0, dst.size()));
  }
  {  // a body cut mid-way: resumed at its first missing byte, the ETag pinned
    std::vector<std::byte> dst(200'000);
    const auto hooks = s.hooks("/cut");
    const auto r = run_blocking(ioc, c.execute(range_get(1000, dst), hooks));
    REQUIRE(r.bytes == dst.size());
    REQUIRE(dst == expected(1000, dst.size()));
    const auto reqs = s.requests();
    REQUIRE(reqs.size() >= 2);
    REQUIRE(reqs[reqs.size() - 2]["range"] == "bytes=1000-200999");
    REQUIRE(reqs.back()["range"] == "bytes=101000-200999");  // half of the first answer arrived
  }
  {  // a refusal the store's classify does not retry: its own error type, one request
    std::vector<std::byte> dst(10);
    const auto n = s.requests().size();
    const auto hooks = s.hooks("/obj", "wrong");
    try {
      (void)run_blocking(ioc, c.execute(range_get(0, dst), hooks));
      FAIL("no error");
    } catch (const store_error& e) {
      REQUIRE(std::string(e.what()) == "GET failed: HTTP 401 unauthorized");
      REQUIRE(e.attempts == 1);
    }
    REQUIRE(s.requests().size() == n + 1);
  }
  {  // after cancel(): cancelled_error naming the store, the endpoint and the object
    c.cancel();
    std::vector<std::byte> dst(10);
    const auto hooks = s.hooks("/obj");
    try {
      (void)run_blocking(ioc, c.execute(range_get(0, dst), hooks));
      FAIL("no error");
    } catch (const cancelled_error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains("TestStore GET cancelled (endpoint http://127.0.0.1:" + s.port) &&
                                 Catch::Contains("object /obj, bytes=0-9"));
    }
  }
  REQUIRE(c.busy_connections() == 0);
}
