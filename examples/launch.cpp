// sluice-launch: runs N local ranks of a command (torchrun-style environment)
// and merges their JSON summaries (see --help).
//
//   sluice-launch -n 8 [--store DIR | --store redis://HOST:PORT/RUN] [--nnodes M --node-rank K]
//                 [--host ADDR] [--comm-timeout SECONDS] [--grace SECONDS] [--no-teardown]
//                 [--json-out FILE] -- sluice-load ...
//
// Each rank gets RANK (K*N + local rank), WORLD_SIZE (M*N), LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, SLUICE_JSON_OUT (where the rank
// writes its JSON summary), and its rendezvous: SLUICE_STORE_DIR (a fresh,
// empty Gloo file-store directory, or --store DIR on a filesystem every node
// shares) or SLUICE_STORE (--store redis://..., for nodes without one; run it
// on every node with the same URL), and SLUICE_GLOO_HOST (--host: this node's
// address that the other nodes reach), and SLUICE_COMM_TIMEOUT_MS
// (--comm-timeout). As torchrun's agent does, the first rank that exits
// non-zero or by a signal ends the group: the others get SIGTERM at once and
// SIGKILL --grace seconds later, and the launcher says which rank failed
// first and how (--no-teardown: wait for every rank, for tests of the
// library's own detection of a dead peer). SIGTERM, SIGINT or SIGHUP to the
// launcher is passed on to every rank (SIGKILL --grace seconds later), its
// temporary directory is removed, and it exits 128 + the signal's number,
// naming it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/comm/store.hpp>

#include "common/args.hpp"

namespace fs = std::filesystem;

namespace {

// The signal that asked the launcher to stop (0: none). Set by the handler,
// read by the wait loop, which passes it on to the ranks.
volatile std::sig_atomic_t stop_signal = 0;
extern "C" void on_stop_signal(int sig) { stop_signal = sig; }

// Removes the launcher's temporary directory on every way out of main.
struct remove_on_exit {
  fs::path dir;
  ~remove_on_exit() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 1, nnodes = 1, node_rank = 0;
  double timeout = 60, grace = 5;
  bool no_teardown = false;
  std::string store, json_out, host = "127.0.0.1";
  // The command is everything after the first "--"; CLI11 sees only what precedes it.
  int i = 1;
  while (i < argc && std::string_view(argv[i]) != "--") ++i;
  const int options_end = i;
  if (i < argc) ++i;   // skip "--": argv[i..] is the command
  CLI::App app("sluice-launch: run N local ranks of a command (torchrun-style environment) and merge\n"
               "their JSON summaries.",
               "sluice-launch");
  app.get_formatter()->column_width(32);
  app.footer("After the options: -- COMMAND ARGS...  (run once per local rank, e.g. -- sluice-load CKPT --topology ...)\n"
             "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
             "SLUICE_JSON_OUT, SLUICE_GLOO_HOST and SLUICE_STORE_DIR (made mode 0700) or SLUICE_STORE.\n"
             "A Redis store that requires a password: set SLUICE_STORE_PASSWORD_FILE (a file of mode 0600)\n"
             "or SLUICE_STORE_PASSWORD; the ranks inherit it.");
  app.add_option("-n,--nproc", n, "local ranks to run (default 1)")->type_name("N");
  app.add_option("--store", store,
                 "rendezvous: a Gloo file-store directory (default: a fresh one; with --nnodes,\n"
                 "one every node shares) or redis://HOST:PORT/RUN (the same URL on every node)")
      ->type_name("DIR|redis://HOST:PORT/RUN");
  app.add_option("--nnodes", nnodes, "nodes, each running this launcher (default 1)")->type_name("M");
  app.add_option("--node-rank", node_rank, "this node's index, below --nnodes (default 0)")->type_name("K");
  app.add_option("--host", host, "this node's address that the other nodes reach (default 127.0.0.1)")
      ->type_name("ADDR");
  app.add_option("--comm-timeout,--timeout", timeout,
                 "every rank's communicator timeout, SLUICE_COMM_TIMEOUT_MS (default 60;\n"
                 "--timeout is its older name)")
      ->type_name("SECONDS");
  app.add_option("--grace", grace, "once a rank has failed: seconds between SIGTERM and SIGKILL to the others (default 5)")
      ->type_name("SECONDS");
  app.add_flag("--no-teardown", no_teardown, "do not signal the other ranks when one fails: wait for every rank");
  app.add_option("--json-out", json_out, "write the merged summary to FILE (default: stdout)")->type_name("FILE");
  if (auto rc = sluice_cli::parse_args(app, options_end, argv, 2)) return *rc;
  if (nnodes == 0 || node_rank >= nnodes) {
    std::fprintf(stderr, "sluice-launch: --node-rank %zu is not below --nnodes %zu\n", node_rank, nnodes);
    return 2;
  }
  const bool redis = store.rfind("redis://", 0) == 0;
  // Several nodes: each must say where the others reach it. The default,
  // 127.0.0.1, would send every other node to itself. (An explicit loopback
  // --host is taken as meant: "nodes" simulated on one machine.)
  if (nnodes > 1 && app.count("--host") == 0) {
    std::fprintf(stderr,
                 "sluice-launch: --nnodes %zu needs --host: this node's address that the other nodes reach (the default, "
                 "127.0.0.1, reaches only this machine)\n",
                 nnodes);
    return 2;
  }
  if (nnodes > 1 && store.empty()) {
    std::fprintf(stderr, "sluice-launch: --nnodes %zu needs --store (a shared directory or redis://HOST:PORT/RUN)\n", nnodes);
    return 2;
  }
  if (i >= argc || n == 0) {
    std::fprintf(stderr, "sluice-launch: no command (usage: sluice-launch -n N -- command args...)\n");
    return 2;
  }
  std::string work_tmpl = (fs::temp_directory_path() / "sluice-launch-XXXXXX").string();
  if (!::mkdtemp(work_tmpl.data())) { std::perror("sluice-launch: mkdtemp"); return 1; }
  const fs::path work = work_tmpl;
  const remove_on_exit cleanup{work};
  // Installed before the ranks start: a signal that arrives while they start
  // is passed on too. (A child runs this handler only until its exec.)
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  if (store.empty()) store = (work / "store").string();
  if (!redis) {
    sluice::comm::make_private_dir(store);  // 0700 where it makes it: the ranks refuse a store others can read
    // Several nodes share the directory: only node 0 may require it empty.
    if (node_rank == 0 && !fs::is_empty(store)) {
      std::fprintf(stderr, "sluice-launch: store directory %s is not empty\n", store.c_str());
      return 2;
    }
  }

  std::vector<pid_t> pids;
  for (std::size_t r = 0; r < n && !stop_signal; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) { std::perror("sluice-launch: fork"); return 1; }
    if (pid == 0) {
      auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
      set("RANK", std::to_string(node_rank * n + r));
      set("WORLD_SIZE", std::to_string(nnodes * n));
      set("LOCAL_RANK", std::to_string(r));
      set("LOCAL_WORLD_SIZE", std::to_string(n));
      set("MASTER_ADDR", host);
      set("MASTER_PORT", "29500");
      if (redis) set("SLUICE_STORE", store);
      else set("SLUICE_STORE_DIR", store);
      set("SLUICE_GLOO_HOST", host);
      set("SLUICE_COMM_TIMEOUT_MS", std::to_string(static_cast<long>(timeout * 1000)));
      set("SLUICE_JSON_OUT", (work / ("rank" + std::to_string(r) + ".json")).string());
      ::execvp(argv[i], argv + i);
      std::perror("sluice-launch: exec");
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  n = pids.size();   // fewer when a stop signal came while they started
  std::vector<int> codes(n, -1);
  std::size_t left = n;
  std::chrono::steady_clock::time_point first_failure{};
  bool failed = false, killed = false;
  int forwarded = 0;   // the stop signal passed on to the ranks
  while (left) {
    if (stop_signal && !forwarded) {
      forwarded = stop_signal;
      const int to_ranks = forwarded == SIGINT ? SIGINT : SIGTERM;
      std::fprintf(stderr, "sluice-launch: stopped by SIG%s: passing SIG%s to %zu running rank(s), SIGKILL after %g s\n",
                   ::sigabbrev_np(forwarded), ::sigabbrev_np(to_ranks), left, grace);
      for (std::size_t q = 0; q < n; ++q)
        if (codes[q] < 0) ::kill(pids[q], to_ranks);
      if (!failed) failed = true, first_failure = std::chrono::steady_clock::now();
    }
    int st = 0;
    const pid_t p = ::waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (std::size_t r = 0; r < n; ++r)
        if (pids[r] == p) {
          codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          --left;
          if (codes[r] != 0 && !failed && !forwarded) {
            failed = true, first_failure = std::chrono::steady_clock::now();
            if (WIFSIGNALED(st))
              std::fprintf(stderr, "sluice-launch: rank %zu failed first: killed by signal %d (%s)%s\n", node_rank * n + r,
                           WTERMSIG(st), ::strsignal(WTERMSIG(st)), no_teardown ? "" : "; ending the other ranks");
            else
              std::fprintf(stderr, "sluice-launch: rank %zu failed first: exit status %d%s\n", node_rank * n + r,
                           WEXITSTATUS(st), no_teardown ? "" : "; ending the other ranks");
            // Our own children, by pid: SIGTERM now, SIGKILL after --grace.
            if (!no_teardown)
              for (std::size_t q = 0; q < n; ++q)
                if (codes[q] < 0) ::kill(pids[q], SIGTERM);
          }
        }
      continue;
    }
    if (failed && (!no_teardown || forwarded) && !killed &&
        std::chrono::steady_clock::now() - first_failure > std::chrono::duration<double>(grace)) {
      killed = true;
      for (std::size_t r = 0; r < n; ++r)
        if (codes[r] < 0) ::kill(pids[r], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the wall clock a run reports ends with its last rank
  }

  // Merge the summaries: every rank's JSON, and sums of the byte counters.
  nlohmann::json merged = {{"world_size", nnodes * n}, {"node_rank", node_rank}, {"local_ranks", n},
                           {"ranks", nlohmann::json::array()}};
  nlohmann::json totals = nlohmann::json::object();
  for (std::size_t r = 0; r < n; ++r) {
    nlohmann::json j;
    std::ifstream f(work / ("rank" + std::to_string(r) + ".json"));
    if (f) {
      try { f >> j; } catch (...) { j = nullptr; }
    }
    if (j.is_object())
      for (const char* k : {"bytes_read", "header_bytes_read", "storage_bytes", "bytes_received", "page_cache_bytes", "node_copied_bytes", "bytes_sent", "shared_bytes_written", "tensors"})
        if (j.contains(k) && j[k].is_number()) totals[k] = totals.value(k, std::uint64_t{0}) + j[k].get<std::uint64_t>();
    merged["ranks"].push_back({{"rank", node_rank * n + r}, {"exit", codes[r]}, {"summary", j}});
  }
  merged["totals"] = totals;
  const auto text = merged.dump(2);
  if (!json_out.empty()) std::ofstream(json_out) << text << "\n";
  else if (!totals.empty()) std::printf("%s\n", text.c_str());
  if (forwarded) {
    std::fprintf(stderr, "sluice-launch: stopped by SIG%s; every rank has ended\n", ::sigabbrev_np(forwarded));
    return 128 + forwarded;
  }
  int rc = 0;
  for (std::size_t r = 0; r < n; ++r)
    if (codes[r] != 0) {
      std::fprintf(stderr, "sluice-launch: rank %zu exited with %d\n", node_rank * n + r, codes[r]);
      rc = 1;
    }
  return rc;
}
