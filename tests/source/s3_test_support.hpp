#pragma once
// Helpers shared by the S3 tests: running child processes (the project's python,
// node, scripts/s3-server.sh), botocore as a signing oracle, and the test servers.
#include <sluice/s3/client.hpp>
#include <sluice/s3/sigv4.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <poll.h>
#include <random>
#include <span>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

extern char** environ;

namespace sluice_test {

/// Runs argv, feeding `input` on stdin; returns {exit status, stdout}.
inline std::pair<int, std::string> run_capture(const std::vector<std::string>& argv, const std::string& input = {}) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC)) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  ::posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    return {127, {}};
  }
  std::signal(SIGPIPE, SIG_IGN);
  for (std::size_t off = 0; off < input.size();) {
    auto n = ::write(in[1], input.data() + off, input.size() - off);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  ::close(in[1]);
  std::string output;
  char buf[4096];
  for (;;) {
    auto n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

inline bool python_has_module(const std::string& module) {
  return run_capture({SLUICE_PYTHON3, "-c", "import " + module}).first == 0;
}

/// botocore's S3SigV4Auth on the same request: returns {canonical request, signature}.
inline std::vector<std::string> botocore_sign(const sluice::s3::signable_request& req,
                                              const sluice::s3::credentials& creds, const std::string& region,
                                              const std::string& amz_date) {
  static const char* script = R"PY(
import json, sys
from botocore.auth import SigV4Auth, S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode
d = json.load(sys.stdin)
headers = {k: v for k, v in d['headers']}
url = 'http://' + headers['host'] + percent_encode(d['path'], safe='/~')
req = AWSRequest(method=d['method'], url=url, headers=headers, params=d['query'])
req.context['timestamp'] = d['timestamp']
auth = S3SigV4Auth(Credentials(d['access_key'], d['secret_key'], d['token'] or None), 's3', d['region'])
SigV4Auth._modify_request_before_signing(auth, req)   # X-Amz-Date, X-Amz-Security-Token
req.headers['X-Amz-Content-SHA256'] = d['payload_hash']
cr = auth.canonical_request(req)
print(json.dumps([cr, auth.signature(auth.string_to_sign(req, cr), req)]))
)PY";
  nlohmann::json in;
  in["method"] = req.method;
  in["path"] = req.path;
  in["query"] = req.query;
  // The headers the caller set, not the ones sign() added: botocore adds its own.
  nlohmann::json hs = nlohmann::json::array();
  for (const auto& [k, v] : req.headers)
    if (k != "authorization" && k != "x-amz-date" && k != "x-amz-security-token" && k != "x-amz-content-sha256")
      hs.push_back({k, v});
  in["headers"] = hs;
  in["timestamp"] = amz_date;
  in["access_key"] = creds.access_key_id;
  in["secret_key"] = creds.secret_access_key;
  in["token"] = creds.session_token;
  in["region"] = region;
  in["payload_hash"] = req.payload_hash;
  auto [rc, out] = run_capture({SLUICE_PYTHON3, "-c", script}, in.dump());
  if (rc != 0) throw std::runtime_error("botocore oracle failed with status " + std::to_string(rc));
  return nlohmann::json::parse(out).get<std::vector<std::string>>();
}

/// A child process with pipes on stdin/stdout; closing stdin and SIGTERM end it.
class child {
 public:
  explicit child(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC)) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    ::posix_spawn_file_actions_init(&fa);
    ::posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    ::posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int rc = ::posix_spawnp(&pid_, args[0], &fa, nullptr, args.data(), environ);
    ::posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("cannot start " + argv[0]);
    }
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child() {
    ::close(stdin_);
    ::close(stdout_);
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  /// One line of stdout (without the newline); throws after `timeout`.
  std::string read_line(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{stdout_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        throw std::runtime_error("child: no output line in time");
      char ch;
      if (::read(stdout_, &ch, 1) != 1) throw std::runtime_error("child: exited before writing a line");
      if (ch == '\n') return line;
      line += ch;
    }
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1;
};

/// The S3 test servers (see scripts/s3-server.sh: moto with SigV4 checking, nginx
/// as its HTTPS endpoint): from SLUICE_S3_ENDPOINT, SLUICE_S3_HTTPS_ENDPOINT,
/// SLUICE_S3_CA_BUNDLE and the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY pair when
/// set; otherwise started here with `scripts/s3-server.sh start` (idempotent;
/// they keep running for the next test, `scripts/s3-server.sh stop` ends them).
/// `error` says why there are none (the test then prints SKIPPED).
struct s3_servers {
  std::string http, https, ca_bundle, access_key_id, secret_access_key, error;
};
inline const s3_servers& servers() {
  static const s3_servers s = [] {
    s3_servers r;
    auto env = [](const char* n) { const char* v = std::getenv(n); return std::string(v ? v : ""); };
    r.http = env("SLUICE_S3_ENDPOINT");
    r.https = env("SLUICE_S3_HTTPS_ENDPOINT");
    r.ca_bundle = env("SLUICE_S3_CA_BUNDLE");
    r.access_key_id = env("AWS_ACCESS_KEY_ID");
    r.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    if (!r.http.empty()) {
      if (r.access_key_id.empty() || r.secret_access_key.empty())
        r.error = "SLUICE_S3_ENDPOINT is set but AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not (eval scripts/s3-server.sh env)";
      return r;
    }
    auto [rc, out] = run_capture({"bash", SLUICE_S3_SERVER_SCRIPT, "start"});
    if (rc != 0) {
      r.error = "scripts/s3-server.sh start failed (run scripts/setup.sh for nginx and the Python environment)";
      return r;
    }
    std::size_t pos = 0;
    while (pos < out.size()) {
      auto nl = out.find('\n', pos);
      auto line = out.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? out.size() : nl + 1;
      if (line.rfind("export ", 0) == 0) line = line.substr(7);
      auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      auto k = line.substr(0, eq), v = line.substr(eq + 1);
      if (k == "SLUICE_S3_ENDPOINT") r.http = v;
      if (k == "SLUICE_S3_HTTPS_ENDPOINT") r.https = v;
      if (k == "SLUICE_S3_CA_BUNDLE") r.ca_bundle = v;
      if (k == "AWS_ACCESS_KEY_ID") r.access_key_id = v;
      if (k == "AWS_SECRET_ACCESS_KEY") r.secret_access_key = v;
    }
    if (r.http.empty() || r.access_key_id.empty()) r.error = "scripts/s3-server.sh start printed no endpoint or key";
    return r;
  }();
  return s;
}

/// In a test case: returns (the test then reports SKIPPED) when there is no S3 test server.
#define REQUIRE_S3_SERVERS()                                                           \
  do {                                                                                 \
    if (!sluice_test::servers().error.empty()) {                                       \
      WARN("SKIPPED: no S3 test server: " << sluice_test::servers().error);            \
      return;                                                                          \
    }                                                                                  \
  } while (0)

// Deletes one object (the sluice client has no DELETE: botocore signs it).
inline bool delete_object(const std::string& bucket, const std::string& key) {
  static const char* script = R"PY(
import sys, boto3
endpoint, bucket, key, ak, sk = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=ak, aws_secret_access_key=sk)
s3.delete_object(Bucket=bucket, Key=key)
)PY";
  return run_capture({SLUICE_PYTHON3, "-c", script, servers().http, bucket, key, servers().access_key_id,
                      servers().secret_access_key})
             .first == 0;
}

/// A client config for the test servers: their IAM key pair (or `secret` in place
/// of theirs, to be refused), fast retries.
inline sluice::s3::config test_config(const std::string& endpoint, const std::string& secret = {}) {
  sluice::s3::config c;
  c.endpoint = sluice::s3::http_endpoint::parse(endpoint);
  c.custom_endpoint = true;
  c.creds = {servers().access_key_id, secret.empty() ? servers().secret_access_key : secret, "", "test"};
  c.ca_bundle = servers().ca_bundle;
  c.max_connections = 4;
  c.retry = {4, std::chrono::milliseconds(10), std::chrono::milliseconds(100)};
  c.low_speed_window = std::chrono::seconds(5);
  return c;
}

/// A bucket name no other test (or test process) uses.
inline std::string unique_bucket(const std::string& stem) {
  static std::atomic<int> n{0};
  return stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

/// Deterministic pseudo-random bytes.
inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 g(seed);
  for (std::size_t i = 0; i < n; i += 8) {
    auto x = g();
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = static_cast<std::byte>(x >> (8 * j));
  }
  return v;
}

/// The fault proxy (tests/support/fault_proxy.js) in front of `upstream`.
struct fault_proxy {
  fault_proxy(const std::string& upstream, const std::string& fault, int every, int stall_ms = 60000)
      : fault_proxy({"--upstream", upstream, "--fault", fault, "--every", std::to_string(every), "--stall-ms",
                     std::to_string(stall_ms)}) {}
  /// Every request answered with HTTP `status` and `body` (the proxy's "body" mode).
  static fault_proxy canned(int status, const std::string& body) {
    return fault_proxy({"--upstream", "http://127.0.0.1:9", "--fault", "body", "--match", "all", "--status",
                        std::to_string(status), "--body", body});
  }
  /// Forwards everything and logs every request to `log` (one JSON line each).
  static fault_proxy logging(const std::string& upstream, const std::string& log) {
    return fault_proxy({"--upstream", upstream, "--fault", "none", "--log", log});
  }
  explicit fault_proxy(std::vector<std::string> args) : proc(with_script(std::move(args))) {
    auto line = proc.read_line();
    if (line.rfind("PORT ", 0) != 0) throw std::runtime_error("fault proxy said: " + line);
    endpoint = "http://127.0.0.1:" + line.substr(5);
  }
  child proc;
  std::string endpoint;

 private:
  static std::vector<std::string> with_script(std::vector<std::string> args) {
    args.insert(args.begin(), {"node", SLUICE_FAULT_PROXY_SCRIPT});
    return args;
  }
};

/// The requests a logging fault_proxy saw, in order: one JSON object each
/// ({"method", "path", "range", "inflight"}: tests/support/fault_proxy.js).
inline std::vector<nlohmann::json> proxy_log(const std::string& log) {
  std::vector<nlohmann::json> out;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// Requests a logging fault_proxy saw, per object key of `bucket` (path-style
/// "/bucket/key?query"; the query is dropped, so a listing counts under the
/// key "" and a prefix listing's key is empty too): key -> count. Methods
/// other than GET and HEAD count under "<METHOD> key".
inline std::map<std::string, std::size_t> requests_per_object(const std::string& log, const std::string& bucket) {
  std::map<std::string, std::size_t> n;
  for (const auto& j : proxy_log(log)) {
    auto path = j["path"].get<std::string>();
    path = path.substr(0, path.find('?'));
    const std::string head = "/" + bucket;
    if (!path.starts_with(head)) {
      ++n["(other bucket) " + path];
      continue;
    }
    auto key = path.size() > head.size() ? path.substr(head.size() + 1) : std::string();
    const auto method = j["method"].get<std::string>();
    ++n[method == "GET" || method == "HEAD" ? key : method + " " + key];
  }
  return n;
}

}  // namespace sluice_test
