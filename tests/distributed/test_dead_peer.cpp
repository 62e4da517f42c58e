// A dead peer in every phase of a distributed load (issue 24). Four forked
// ranks load a small checkpoint over Gloo with a communicator timeout of
// 300 s; the test fault hook (distributed/fault.hpp) makes one rank raise
// SIGKILL on itself when the load enters a phase. Every survivor must throw
// comm::peer_lost naming that rank and the phase it was in, within a quarter
// of the timeout: a bound derived from the timeout, which tells detection
// from a timeout (a hang would take all 300 s), not a claim about speed.
//
// A stopped peer (SIGSTOP) is not dead: with a 10 s timeout the survivors
// throw comm::comm_timeout naming the rank that did not reach the phase, never
// peer_lost. Then the test kills it and, once every process has ended,
// counts what is left: the survivors' descriptors, threads and segments
// (counted inside each survivor) and the store's keys.
//
// The device lane: a rank dies while its peers wait in a device exchange
// whose transport, like NCCL's, does not see the death itself; the tool-level
// load must hand the lane the host communicator's liveness signal
// (comm::liveness_of, nccl_options::liveness), or the peers wait for the
// timeout.
//
// Nothing here depends on timing: the faults are placed by phase, not by the
// clock.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <sluice/distributed.hpp>
#include <sluice/testing/emulated_device_lane.hpp>
#include <sluice/testing/generator.hpp>

#include "comm/multiprocess.hpp"
#include "comm/recording_sink.hpp"
#include "distributed/small_load.hpp"
#include "support/footprint.hpp"

using namespace sluice;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const fs::path& checkpoint_dir() {
  static const fs::path dir = sluice_test::write_small_checkpoint("deadpeer-ckpt");
  return dir;
}

using sluice_test::small_options;

comm::rank_info world(std::size_t rank, std::size_t n, const fs::path& store, std::chrono::milliseconds timeout) {
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n;
  who.store_dir = store.string();
  who.timeout = timeout;
  return who;
}

// Rank exit codes.
constexpr int ok = 0, wrong_type = 20, wrong_rank = 21, no_phase = 22, too_late = 23, no_error = 24, leaked = 25;

// Forks `n` ranks running body(rank); waits for every rank but `stopped`,
// then kills `stopped` (if any) and waits for it. Returns exit codes
// (-signal for a signal).
std::vector<int> run_world(std::size_t n, const std::function<int(std::size_t)>& body, int stopped = -1,
                           std::chrono::seconds deadline = 300s) {
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
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(n, -1000);
  auto reap = [&](std::size_t r, int options) {
    int st = 0;
    if (::waitpid(pids[r], &st, options) != pids[r]) return false;
    codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    return true;
  };
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    bool all = true;
    for (std::size_t r = 0; r < n; ++r)
      if (static_cast<int>(r) != stopped && codes[r] == -1000 && !reap(r, WNOHANG)) all = false;
    if (all) break;
    if (std::chrono::steady_clock::now() > end) {
      for (std::size_t r = 0; r < n; ++r)
        if (codes[r] == -1000) ::kill(pids[r], SIGKILL), reap(r, 0);
      return codes;
    }
    std::this_thread::sleep_for(10ms);
  }
  if (stopped >= 0) {
    ::kill(pids[stopped], SIGKILL);  // our own child, by pid
    reap(static_cast<std::size_t>(stopped), 0);
  }
  return codes;
}

// The phases a survivor may name when the victim dies entering `phase`: that
// phase, or the one before (the victim can leave a collective before its
// peers have: they learn of the death while still in it). Windows without a
// message exchange no status (window_schedule::status): the victim can die
// delivering a window while its peers are still in the phase before the
// windows (the shared tables' status exchange).
std::vector<std::string> phases_seen(const std::string& phase) {
  if (phase == "open") return {"joining the world", "opening the checkpoint"};
  if (phase == "plan") return {"opening the checkpoint", "comparing load plans"};
  if (phase == "tables") return {"handing over the shared segment", "reading shared tables"};
  if (phase == "reads") return {"reading shared tables", "reading window"};
  if (phase == "exchange") return {"exchanging window", "reading window"};
  return {"reading shared tables", "reading window", "exchanging window", "delivering tensors"};  // delivery
}

// Kills `victim` entering `phase`; checks every survivor's error.
// The victim died by SIGKILL and every survivor exited `ok`; a survivor that
// did not shows its log (rank<r>.txt in `out`) and what its code means.
void check_survivors(const std::vector<int>& codes, std::size_t victim, const fs::path& out, const std::string& what,
                     const std::string& codes_meaning) {
  for (std::size_t r = 0; r < codes.size(); ++r) {
    if (r == victim) {
      CHECK(codes[r] == -SIGKILL);
      continue;
    }
    std::ifstream f(out / fmt::format("rank{}.txt", r));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    INFO("rank " << victim << " killed " << what << "; rank " << r << " (" << codes_meaning << "): " << text);
    CHECK(codes[r] == ok);
  }
}

constexpr const char* survivor_codes =
    "20: not peer_lost, 21: names another rank, 22: names no phase or another, 23: after a quarter of the timeout, "
    "24: no error";

void kill_entering(const std::string& phase, std::size_t victim) {
  constexpr auto timeout = 300s;
  const auto base = sluice_test::fresh_dir("deadpeer-" + phase);
  const auto store = base / "store", out = base / "out";
  comm::make_private_dir(store.string()), fs::create_directories(out);
  const auto& ck = checkpoint_dir();
  const auto segment = fmt::format("sluice-deadpeer-{}-{}-{}", ::getpid(), phase, victim);
  const auto codes = run_world(4, [&](std::size_t rank) {
    std::ofstream log(out / fmt::format("rank{}.txt", rank));
    ::setenv("SLUICE_TEST_FAULT", fmt::format("{}:{}:KILL", phase, victim).c_str(), 1);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      sluice_test::recording_sink s;
      // Messages in flight: over Gloo, not through the node's page cache
      // (whose windows carry none, and call no exchange).
      auto o = small_options(segment);
      if (phase == "exchange") o.page_cache = o.node_window = false;
      (void)load_distributed(location(ck.string()), "tp1,dp4,ep4", "shared-cooperative", world(rank, 4, store, timeout), s, o);
    } catch (const comm::peer_lost& e) {
      const auto took = std::chrono::steady_clock::now() - t0;
      log << e.what() << "\n";
      if (e.lost_rank() != victim) return wrong_rank;
      bool named = false;
      for (const auto& p : phases_seen(phase)) named = named || e.phase().rfind(p, 0) == 0;
      if (!named) return no_phase;
      return took < timeout / 4 ? ok : too_late;
    } catch (const std::exception& e) {
      log << "not peer_lost: " << e.what() << "\n";
      return wrong_type;
    }
    return no_error;
  });
  check_survivors(codes, victim, out, "entering " + phase, survivor_codes);
  fs::remove_all(base);
}

// The emulated device lane, except in its `stall_at`-th exchange: there the
// victim waits until every other rank has entered that exchange, then kills
// itself; the others wait as NCCL's kernels wait on a peer that is gone,
// asking the liveness signal the lane was made with (what comm::nccl asks
// between its polls) until the timeout. Nothing but that signal ends their
// wait before the timeout: the lane never calls the host communicator there.
template <class Comm>
class stalling_lane : public testing::emulated_device_lane<Comm> {
 public:
  stalling_lane(Comm& c, std::function<void()> liveness, int stall_at, std::size_t victim, fs::path marks,
                std::chrono::milliseconds timeout)
      : testing::emulated_device_lane<Comm>(c), rank_(c.rank()), size_(c.size()), liveness_(std::move(liveness)),
        stall_at_(stall_at), victim_(victim), marks_(std::move(marks)), timeout_(timeout) {}
  void exchange(std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) {
    if (++exchanges_ != stall_at_) return testing::emulated_device_lane<Comm>::exchange(sends, recvs);
    if (rank_ == victim_) {
      while (static_cast<std::size_t>(std::distance(fs::directory_iterator(marks_), fs::directory_iterator())) < size_ - 1)
        std::this_thread::sleep_for(1ms);
      ::raise(SIGKILL);
    }
    std::ofstream(marks_ / fmt::format("rank{}", rank_)) << "waiting\n";
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (std::chrono::steady_clock::now() < deadline) {
      if (liveness_) liveness_();  // comm::peer_lost: the only way out before the timeout
      std::this_thread::sleep_for(1ms);
    }
    throw comm::comm_error("stalling lane: no completion within the timeout");
  }

 private:
  std::size_t rank_, size_;
  std::function<void()> liveness_;
  int stall_at_, exchanges_ = 0;
  std::size_t victim_;
  fs::path marks_;
  std::chrono::milliseconds timeout_;
};

// Kills `victim` in its second device exchange, through the tool-level load
// with a lane factory (sluice-load --device's path).
void kill_in_device_exchange(std::size_t victim) {
  constexpr auto timeout = 300s;
  constexpr int not_in_lane = 27;
  const auto base = sluice_test::fresh_dir(fmt::format("deadpeer-lane-{}", victim));
  const auto store = base / "store", out = base / "out", marks = base / "marks";
  comm::make_private_dir(store.string()), fs::create_directories(out), fs::create_directories(marks);
  const auto& ck = checkpoint_dir();
  const auto segment = fmt::format("sluice-deadpeer-{}-lane-{}", ::getpid(), victim);
  const auto codes = run_world(4, [&](std::size_t rank) {
    std::ofstream log(out / fmt::format("rank{}.txt", rank));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      sluice_test::recording_sink s;
      const auto o = small_options(segment);
      (void)load_distributed(location(ck.string()), "tp1,dp4,ep4", "none", world(rank, 4, store, timeout), s, o, {},
                             [&](auto& host) {
                               return stalling_lane<std::remove_cvref_t<decltype(host)>>(host, comm::liveness_of(host), 2,
                                                                                        victim, marks, timeout);
                             });
    } catch (const comm::peer_lost& e) {
      const auto took = std::chrono::steady_clock::now() - t0;
      log << e.what() << "\n";
      if (e.lost_rank() != victim) return wrong_rank;
      if (e.phase().rfind("exchanging window 2 of", 0) != 0) return no_phase;
      // Its mark says it waited in the lane, where only the liveness signal throws peer_lost.
      if (!fs::exists(marks / fmt::format("rank{}", rank))) return not_in_lane;
      return took < timeout / 4 ? ok : too_late;
    } catch (const std::exception& e) {
      log << "not peer_lost: " << e.what() << "\n";
      return wrong_type;
    }
    return no_error;
  });
  check_survivors(codes, victim, out, "in its second device exchange",
                  std::string(survivor_codes) + ", 27: did not wait in the lane");
  fs::remove_all(base);
}

}  // namespace

TEST_CASE("a rank killed opening the checkpoint: every survivor throws peer_lost naming it and the phase", "[distributed][dead-peer]") {
  kill_entering("open", 0);
  kill_entering("open", 2);
}

TEST_CASE("a rank killed comparing plans: every survivor throws peer_lost naming it and the phase", "[distributed][dead-peer]") {
  kill_entering("plan", 0);
  kill_entering("plan", 3);
}

TEST_CASE("a rank killed reading shared tables: every survivor throws peer_lost naming it and the phase", "[distributed][dead-peer]") {
  kill_entering("tables", 0);
  kill_entering("tables", 1);
}

TEST_CASE("a rank killed reading a window: every survivor throws peer_lost naming it and the phase", "[distributed][dead-peer]") {
  kill_entering("reads", 0);
  kill_entering("reads", 2);
}

TEST_CASE("a rank killed with messages in flight: every survivor throws peer_lost naming it and the phase", "[distributed][dead-peer]") {
  kill_entering("exchange", 0);
  kill_entering("exchange", 3);
}

TEST_CASE("a rank killed delivering: every survivor throws peer_lost naming it and the phase", "[distributed][dead-peer]") {
  kill_entering("delivery", 0);
  kill_entering("delivery", 1);
}

TEST_CASE("a stopped rank is not dead: the survivors time out naming it, and nothing is left once it is killed",
          "[distributed][dead-peer]") {
  constexpr auto timeout = 10s;
  constexpr std::size_t stopped = 2;
  const auto base = sluice_test::fresh_dir("deadpeer-stop");
  const auto store = base / "store", out = base / "out";
  comm::make_private_dir(store.string()), fs::create_directories(out);
  const auto& ck = checkpoint_dir();
  const auto segment = fmt::format("sluice-deadpeer-{}-stop", ::getpid());
  const auto codes = run_world(
      4,
      [&](std::size_t rank) {
        std::ofstream log(out / fmt::format("rank{}.txt", rank));
        ::setenv("SLUICE_TEST_FAULT", fmt::format("tables:{}:STOP", stopped).c_str(), 1);
        sluice_test::footprint::start_runtime_threads();
        const auto before = sluice_test::footprint::now(segment);
        try {
          sluice_test::recording_sink s;
          (void)load_distributed(location(ck.string()), "tp1,dp4,ep4", "shared-cooperative", world(rank, 4, store, timeout), s,
                                 small_options(segment));
        } catch (const comm::comm_timeout& e) {
          log << e.what() << "\n";
          const auto after = sluice_test::footprint::now(segment);
          log << "before: " << before.str() << "\nafter: " << after.str() << "\n";
          if (e.lagging() != std::vector<std::size_t>{stopped}) return wrong_rank;
          if (e.phase().rfind("reading shared tables", 0) != 0) return no_phase;
          if (!after.same_counts(before) || after.segment_fds || after.segment_maps || after.shm_entries) return leaked;
          return ok;
        } catch (const std::exception& e) {
          log << "not comm_timeout: " << e.what() << "\n";
          return wrong_type;
        }
        return no_error;
      },
      static_cast<int>(stopped));
  std::string keys;
  const auto left = sluice_test::store_keys(store, &keys);
  CHECK(codes[stopped] == -SIGKILL);
  for (std::size_t r = 0; r < 4; ++r) {
    if (r == stopped) continue;
    std::ifstream f(out / fmt::format("rank{}.txt", r));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    INFO("rank " << r << " (20: not comm_timeout, 21: does not name rank 2 alone, 22: names no phase or another, 24: no "
                        "error, 25: left descriptors, threads or segments): "
                 << text);
    CHECK(codes[r] == ok);
  }
  INFO("store keys left: " << keys);
  CHECK(left == 0);
  fs::remove_all(base);
}

TEST_CASE("a rank killed while its peers wait in a device exchange: the lane made in the world hears it, every survivor throws peer_lost",
          "[distributed][dead-peer][lane]") {
  kill_in_device_exchange(0);
  kill_in_device_exchange(3);
}
