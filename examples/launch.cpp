// sluice-launch: runs N local ranks of a command (torchrun-style environment)
// and merges their JSON summaries.
//
//   sluice-launch -n 8 [--store DIR] [--timeout SECONDS] [--json-out FILE] -- sluice-load ...
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, SLUICE_STORE_DIR (a fresh, empty Gloo file-store directory)
// and SLUICE_JSON_OUT (where the rank writes its JSON summary). When a rank
// fails, the others get --timeout seconds to fail too, then are killed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::size_t n = 1;
  double timeout = 60;
  std::string store, json_out;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") { ++i; break; }
    if ((a == "-n" || a == "--nproc") && i + 1 < argc) n = std::stoul(argv[++i]);
    else if (a == "--store" && i + 1 < argc) store = argv[++i];
    else if (a == "--timeout" && i + 1 < argc) timeout = std::stod(argv[++i]);
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: sluice-launch -n N [--store DIR] [--timeout S] [--json-out FILE] -- command args...\n");
      return 2;
    }
  }
  if (i >= argc || n == 0) {
    std::fprintf(stderr, "sluice-launch: no command (usage: sluice-launch -n N -- command args...)\n");
    return 2;
  }
  std::string work_tmpl = (fs::temp_directory_path() / "sluice-launch-XXXXXX").string();
  if (!::mkdtemp(work_tmpl.data())) { std::perror("sluice-launch: mkdtemp"); return 1; }
  const fs::path work = work_tmpl;
  if (store.empty()) store = (work / "store").string();
  fs::create_directories(store);
  if (!fs::is_empty(store)) { std::fprintf(stderr, "sluice-launch: store directory %s is not empty\n", store.c_str()); return 2; }

  std::vector<pid_t> pids;
  for (std::size_t r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) { std::perror("sluice-launch: fork"); return 1; }
    if (pid == 0) {
      auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
      set("RANK", std::to_string(r));
      set("WORLD_SIZE", std::to_string(n));
      set("LOCAL_RANK", std::to_string(r));
      set("LOCAL_WORLD_SIZE", std::to_string(n));
      set("MASTER_ADDR", "127.0.0.1");
      set("MASTER_PORT", "29500");
      set("SLUICE_STORE_DIR", store);
      set("SLUICE_COMM_TIMEOUT_MS", std::to_string(static_cast<long>(timeout * 1000)));
      set("SLUICE_JSON_OUT", (work / ("rank" + std::to_string(r) + ".json")).string());
      ::execvp(argv[i], argv + i);
      std::perror("sluice-launch: exec");
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(n, -1);
  std::size_t left = n;
  std::chrono::steady_clock::time_point first_failure{};
  bool failed = false;
  while (left) {
    int st = 0;
    const pid_t p = ::waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (std::size_t r = 0; r < n; ++r)
        if (pids[r] == p) {
          codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          --left;
          if (codes[r] != 0 && !failed) failed = true, first_failure = std::chrono::steady_clock::now();
        }
      continue;
    }
    if (failed && std::chrono::steady_clock::now() - first_failure > std::chrono::duration<double>(timeout)) {
      for (std::size_t r = 0; r < n; ++r)
        if (codes[r] < 0) ::kill(pids[r], SIGKILL);  // our own children, by pid
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // Merge the summaries: every rank's JSON, and sums of the byte counters.
  nlohmann::json merged = {{"world_size", n}, {"ranks", nlohmann::json::array()}};
  nlohmann::json totals = nlohmann::json::object();
  for (std::size_t r = 0; r < n; ++r) {
    nlohmann::json j;
    std::ifstream f(work / ("rank" + std::to_string(r) + ".json"));
    if (f) {
      try { f >> j; } catch (...) { j = nullptr; }
    }
    if (j.is_object())
      for (const char* k : {"bytes_read", "storage_bytes", "bytes_received", "bytes_sent", "shared_bytes_written", "tensors"})
        if (j.contains(k) && j[k].is_number()) totals[k] = totals.value(k, std::uint64_t{0}) + j[k].get<std::uint64_t>();
    merged["ranks"].push_back({{"rank", r}, {"exit", codes[r]}, {"summary", j}});
  }
  merged["totals"] = totals;
  const auto text = merged.dump(2);
  if (!json_out.empty()) std::ofstream(json_out) << text << "\n";
  else if (!totals.empty()) std::printf("%s\n", text.c_str());
  fs::remove_all(work);
  int rc = 0;
  for (std::size_t r = 0; r < n; ++r)
    if (codes[r] != 0) {
      std::fprintf(stderr, "sluice-launch: rank %zu exited with %d\n", r, codes[r]);
      rc = 1;
    }
  return rc;
}
