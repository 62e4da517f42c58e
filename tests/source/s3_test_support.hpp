#pragma once
// Helpers shared by the S3 tests: running child processes (python3, node,
// scripts/s3-server.sh), botocore as a signing oracle, and the test servers.
#include <sluice/source/s3/sigv4.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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

}  // namespace sluice_test
