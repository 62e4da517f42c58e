#pragma once
// Runs a function as N forked ranks and collects their exit codes; a rank
// still running at the deadline is killed (and reported as -SIGKILL).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace sluice_test {

struct rank_result {
  int code = -1;        ///< exit status, or -signal
  bool timed_out = false;
};

inline std::vector<rank_result> run_ranks(std::size_t n, const std::function<int(std::size_t)>& body,
                                          std::chrono::seconds deadline = std::chrono::seconds(120)) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (std::size_t r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %zu: %s\n", r, e.what());
        code = 3;
      } catch (...) {
        code = 4;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<rank_result> out(n);
  std::vector<bool> done(n, false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::size_t left = n;
  while (left > 0) {
    for (std::size_t r = 0; r < n; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        out[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        done[r] = true;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > end) {
      for (std::size_t r = 0; r < n; ++r)
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          int st = 0;
          ::waitpid(pids[r], &st, 0);
          out[r] = {-SIGKILL, true};
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return out;
}

/// A fresh empty directory (a Gloo FileStore needs one per run).
inline std::filesystem::path fresh_dir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("sluice-" + tag + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

/// A fresh directory that lives as long as the test process: removed at its
/// exit by the process that made it (a forked rank's exit leaves it alone).
/// For the checkpoints that a file's tests share.
inline std::filesystem::path process_dir(const std::string& tag) {
  struct registry {
    pid_t owner = ::getpid();
    std::vector<std::filesystem::path> dirs;
    ~registry() {
      if (::getpid() != owner) return;
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static registry made;
  made.dirs.push_back(fresh_dir(tag));
  return made.dirs.back();
}

}  // namespace sluice_test
