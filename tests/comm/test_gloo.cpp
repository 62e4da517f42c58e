#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <sched.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <sluice/gloo/communicator.hpp>
#include <sluice/comm/local.hpp>

#include "gloo/peer_watch.hpp"   // src/gloo: the component's private watch
#include "multiprocess.hpp"
#include "support/redis_server.hpp"

using namespace sluice;
using namespace std::chrono_literals;

namespace {
std::byte pattern(std::size_t rank, std::size_t i) { return static_cast<std::byte>((rank * 131 + i * 7) & 0xff); }

comm::gloo connect(std::size_t rank, std::size_t n, const std::filesystem::path& dir, std::chrono::milliseconds t = 20s) {
  return comm::gloo(rank, n, comm::gloo_options{.store = {.dir = dir.string()}, .hostname = "127.0.0.1", .timeout = t});
}

using sluice_test::redis_server;

// An in-memory kv_store shared by ranks that are threads of one process (as a
// program's own store, e.g. torch.distributed's, would be shared by processes).
class memory_store final : public comm::kv_store {
 public:
  void set(const std::string& key, const std::vector<char>& value) override {
    {
      std::lock_guard g(mu_);
      map_[key] = value;
      ever_.insert(key);
    }
    cv_.notify_all();
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::lock_guard g(mu_);
    return map_.at(key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock l(mu_);
    const bool ok = cv_.wait_for(l, timeout, [&] {
      for (const auto& k : keys)
        if (!map_.contains(k)) return false;
      return true;
    });
    if (!ok) throw comm::comm_error(fmt::format("memory store: key '{}' not set in time", keys.front()));
  }
  void erase(const std::string& key) override {
    std::lock_guard g(mu_);
    map_.erase(key);
  }
  // Keys set so far under `p` (removed ones included), and keys still there.
  std::size_t keys_set_with_prefix(const std::string& p) {
    std::lock_guard g(mu_);
    std::size_t n = 0;
    for (const auto& k : ever_) n += k.rfind(p, 0) == 0 ? 1 : 0;
    return n;
  }
  std::size_t keys_left() {
    std::lock_guard g(mu_);
    return map_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> map_;
  std::set<std::string> ever_;
};
}  // namespace

TEST_CASE("communicators model the concept", "[comm][concepts]") {
  STATIC_REQUIRE(comm::communicator<comm::local>);
  STATIC_REQUIRE(comm::communicator<comm::gloo>);
  comm::local c;
  std::vector<std::byte> in(4, std::byte{7}), out(4);
  c.all_gather(in, out);
  REQUIRE(out == in);
  REQUIRE_THROWS_AS(c.broadcast(out, 1), comm::comm_error);
  c.exchange({}, {});  // a world of one has nothing to exchange
  const comm::send_message m{0, 0, in};
  REQUIRE_THROWS_AS(c.exchange(std::span(&m, 1), {}), comm::comm_error);
}

TEST_CASE("4 gloo ranks broadcast, all-gather and all-gather-v over loopback", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloo4");
  auto res = sluice_test::run_ranks(4, [&](std::size_t rank) {
    auto c = connect(rank, 4, dir);
    // broadcast 8 MiB from rank 2
    std::vector<std::byte> buf(8u << 20);
    if (rank == 2)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(2, i);
    c.broadcast(buf, 2);
    for (std::size_t i = 0; i < buf.size(); i += 4093)
      if (buf[i] != pattern(2, i)) return 10;
    // all_gather: small parts go from every rank to every other, parts over
    // 64 KiB take Gloo's ring; either way every part lands in its rank's
    // place, also when this rank's part already lies there (in place).
    for (const std::size_t n : {std::size_t{16}, std::size_t{64} << 10, (std::size_t{64} << 10) + 1, std::size_t{1} << 20})
      for (const bool in_place : {false, true}) {
        std::vector<std::byte> mine(n), all(4 * n);
        auto& part = in_place ? all : mine;
        const std::size_t at = in_place ? rank * n : 0;
        for (std::size_t i = 0; i < n; ++i) part[at + i] = pattern(rank + n, i);
        c.all_gather(std::span(part).subspan(at, n), all);
        for (std::size_t r = 0; r < 4; ++r)
          for (std::size_t i = 0; i < n; i += (n > 4096 ? 61 : 1))
            if (all[r * n + i] != pattern(r + n, i)) return 11;
      }
    // all_gather_v, uneven (one rank contributes nothing), in place
    const std::vector<std::size_t> counts{1000, 0, 333333, 17};
    std::vector<std::byte> v(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    const std::size_t at = std::accumulate(counts.begin(), counts.begin() + static_cast<long>(rank), std::size_t{0});
    for (std::size_t i = 0; i < counts[rank]; ++i) v[at + i] = pattern(rank, i);
    c.all_gather_v(v, counts);
    std::size_t off = 0;
    for (std::size_t r = 0; r < 4; ++r) {
      for (std::size_t i = 0; i < counts[r]; ++i)
        if (v[off + i] != pattern(r, i)) return 12;
      off += counts[r];
    }
    c.barrier();
    return 0;
  });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(res[r].code == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the Gloo loop's thread is named sluice-gloo and runs in batch, so a message cannot preempt a rank's post",
          "[comm][gloo]") {
  // Named and in batch at the loop's first wake, before any pair connects
  // (loop_ticker in src/gloo/gloo.cpp: why batch).
  const auto dir = sluice_test::fresh_dir("gloo-loop");
  auto res = sluice_test::run_ranks(2, [&](std::size_t rank) {
    auto c = connect(rank, 2, dir);
    c.barrier();  // the loop has woken since the device was made
    int found = 0, batch = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(e.path() / "comm");
      std::string name;
      std::getline(comm, name);
      if (name != "sluice-gloo") continue;
      ++found;
      batch += ::sched_getscheduler(static_cast<pid_t>(std::stol(e.path().filename().string()))) == SCHED_BATCH ? 1 : 0;
    }
    if (found != 1) return 10 + found;  // 10: no thread of this rank is named sluice-gloo
    return batch == 1 ? 0 : 20;         // 20: the loop's thread preempts on wakeup (SCHED_OTHER)
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE(res[r].code == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("4 gloo ranks exchange targeted messages, a rank with none still takes part", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloo-x");
  auto res = sluice_test::run_ranks(4, [&](std::size_t rank) {
    auto c = connect(rank, 4, dir);
    // Rank r (r < 3) sends (r+1) x 100000 + q bytes to each q > r; rank 3 sends nothing.
    // Several messages between the same pair, told apart by their tags.
    auto size_of = [](std::size_t from, std::size_t to) { return (from + 1) * 100000 + to; };
    std::vector<std::vector<std::byte>> out, in;
    std::vector<comm::send_message> sends;
    std::vector<comm::recv_message> recvs;
    std::uint32_t tag = 0;
    for (std::size_t from = 0; from < 4; ++from)
      for (std::size_t to = from + 1; to < 4; ++to)
        for (int copy = 0; copy < 2; ++copy, ++tag) {
          if (from == 3) continue;
          if (from == rank) {
            out.emplace_back(size_of(from, to));
            for (std::size_t i = 0; i < out.back().size(); ++i) out.back()[i] = pattern(from * 16 + tag, i);
            sends.push_back({to, tag, out.back()});
          }
          if (to == rank) {
            in.emplace_back(size_of(from, to));
            recvs.push_back({from, tag, in.back()});
          }
        }
    c.exchange(sends, recvs);
    for (const auto& m : recvs)
      for (std::size_t i = 0; i < m.bytes.size(); i += 997)
        if (m.bytes[i] != pattern(m.peer * 16 + m.tag, i)) return 20;
    // Twice more, nothing to say: the calls still pair up.
    c.exchange({}, {});
    c.exchange({}, {});
    // A message to oneself is a config_error, not a hang.
    std::vector<std::byte> b(4);
    const comm::send_message self{rank, 0, b};
    try {
      c.exchange(std::span(&self, 1), {});
      return 21;
    } catch (const config_error&) {
    }
    c.barrier();
    return 0;
  });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(res[r].code == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("8 gloo ranks meet through one file store", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloo8");
  auto res = sluice_test::run_ranks(8, [&](std::size_t rank) {
    auto c = connect(rank, 8, dir);
    std::vector<std::byte> mine(8, static_cast<std::byte>(rank)), all(64);
    c.all_gather(mine, all);
    for (std::size_t r = 0; r < 8; ++r)
      if (all[r * 8] != static_cast<std::byte>(r)) return 10;
    c.barrier();
    return 0;
  });
  for (std::size_t r = 0; r < 8; ++r) REQUIRE(res[r].code == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("2 gloo ranks meet through a program's kv_store, under the load's prefix", "[comm][gloo][kv]") {
  auto store = std::make_shared<memory_store>();
  std::vector<std::vector<std::byte>> all(2, std::vector<std::byte>(16));
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (std::size_t rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        comm::rank_info who;
        who.hostname = "127.0.0.1";  // every "node" of the test is this machine
        who.rank = rank;
        who.world_size = 2;
        who.timeout = 20s;
        who.kv = store;
        who.kv_prefix = "load-7";
        comm::gloo c(who);
        std::vector<std::byte> mine(8, static_cast<std::byte>(rank + 1));
        c.all_gather(mine, all[rank]);
        c.barrier();
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
    for (std::size_t i = 0; i < 16; ++i) REQUIRE(all[r][i] == static_cast<std::byte>(i / 8 + 1));
  }
  REQUIRE(store->keys_set_with_prefix("load-7/") >= 2);  // every key went under the load's prefix
  REQUIRE(store->keys_set_with_prefix("load-7/") == store->keys_set_with_prefix(""));
  REQUIRE(store->keys_left() == 0);  // and each rank removed its own once both had met
}

TEST_CASE("a peer missing from a kv_store rendezvous is a comm_error, not a hang", "[comm][gloo][kv]") {
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = 0;
  who.world_size = 2;
  who.timeout = 1s;
  auto store = std::make_shared<memory_store>();
  who.kv = store;
  REQUIRE_THROWS_AS(comm::gloo(who), comm::comm_error);
  REQUIRE(store->keys_set_with_prefix("") > 0);
  REQUIRE(store->keys_left() == 0);  // a rendezvous that failed leaves no key either
}

TEST_CASE("a dead peer makes the others' collective throw, not hang, later ones throw at once", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloodead");
  auto res = sluice_test::run_ranks(
      3,
      [&](std::size_t rank) {
        auto c = connect(rank, 3, dir, 5s);
        std::vector<std::byte> buf(1u << 20);
        try {
          // Rank 1 leaves the barrier once its own part is done, and may be
          // gone before another rank's part is: that rank's barrier fails then.
          c.barrier();
          if (rank == 1) ::_exit(9);  // dies without a word
          c.broadcast(buf, 1);
        } catch (const comm::comm_error& e) {
          std::fprintf(stderr, "rank %zu: %s\n", rank, e.what());
          const std::string first = std::string(e.what()).find("gloo barrier") != std::string::npos ? "barrier" : "broadcast";
          // The communicator is broken now: the next collective throws at
          // once (well within the 5 s timeout), naming the first failure.
          const auto t0 = std::chrono::steady_clock::now();
          try {
            c.barrier();
          } catch (const comm::comm_error& again) {
            const std::string w = again.what();
            if (w.find("failed earlier") == std::string::npos || w.find(first) == std::string::npos) return 43;
            return std::chrono::steady_clock::now() - t0 < 2s ? 42 : 44;
          }
          return 45;
        }
        return 0;
      },
      60s);
  REQUIRE(res[1].code == 9);
  REQUIRE(res[0].code == 42);  // 43: the second error does not name the first; 44: it waited; 45: no error
  REQUIRE(res[2].code == 42);
  std::filesystem::remove_all(dir);
}

TEST_CASE("liveness() throws peer_lost naming a peer once it died, and nothing before", "[comm][gloo]") {
  // What nccl_options::liveness gets from the host communicator: the peer
  // watch's word, without a collective. The timeout (300 s) is far beyond
  // the test's deadline: only the watch can end the survivors' wait.
  const auto dir = sluice_test::fresh_dir("gloolive");
  auto res = sluice_test::run_ranks(
      3,
      [&](std::size_t rank) {
        auto c = connect(rank, 3, dir, 300s);
        const auto alive = c.liveness();
        c.barrier();
        try {
          alive();
        } catch (const comm::peer_lost&) {
          return 41;  // a peer taken for dead while every one is up
        }
        if (rank == 1) {
          c.barrier();
          ::_exit(9);  // dies without a word
        }
        try {
          c.barrier();  // may end before rank 1 dies, or throw when it has
        } catch (const comm::peer_lost& e) {
          if (e.lost_rank() != 1) return 43;
        }
        for (;;) {
          try {
            alive();
          } catch (const comm::peer_lost& e) {
            return e.lost_rank() == 1 ? 42 : 43;
          }
          std::this_thread::sleep_for(10ms);
        }
      },
      60s);
  REQUIRE(res[1].code == 9);
  REQUIRE(res[0].code == 42);  // 41: a live peer taken for dead; 43: another rank named
  REQUIRE(res[2].code == 42);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a missing peer makes rendezvous time out with comm_error", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloomissing");
  REQUIRE_THROWS_AS(connect(0, 2, dir, 1s), comm::comm_error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a Redis store URL parses into host, port and run prefix, bad ones are config errors", "[comm][store]") {
  const auto a = comm::store_address::parse("redis://10.0.0.1:7000/run-42");
  CHECK(a.redis());
  CHECK(a.redis_host == "10.0.0.1");
  CHECK(a.redis_port == 7000);
  CHECK(a.prefix == "run-42");
  const auto b = comm::store_address::parse("redis://store-host");
  CHECK(b.redis_port == 6379);
  CHECK(b.prefix.empty());
  const auto d = comm::store_address::parse("/tmp/some/dir");
  CHECK_FALSE(d.redis());
  CHECK(d.dir == "/tmp/some/dir");
  CHECK_THROWS_WITH(comm::store_address::parse("redis://host:http/x"), Catch::Contains("port 'http' is not a TCP port"));
  CHECK_THROWS_WITH(comm::store_address::parse("redis://:6379/x"), Catch::Contains("no host"));
  CHECK_THROWS_AS(comm::store_address::parse("redis://h:70000"), config_error);
}

TEST_CASE("8 gloo ranks meet through a Redis store, twice under different run prefixes", "[comm][gloo][redis]") {
  redis_server redis;
  if (!redis.ready()) {
    WARN("redis-server not available (scripts/setup.sh installs it): Redis rendezvous not tested");
    return;
  }
  for (const char* run : {"run-a", "run-b"}) {  // each run removes its keys once its ranks have met
    auto res = sluice_test::run_ranks(8, [&](std::size_t rank) {
      comm::gloo_options o;
      o.store = comm::store_address::parse(fmt::format("redis://127.0.0.1:{}/{}", redis.port(), run));
      o.timeout = 20s;
      comm::gloo c(rank, 8, o);
      std::vector<std::byte> mine(8, static_cast<std::byte>(rank)), all(64);
      c.all_gather(mine, all);
      for (std::size_t r = 0; r < 8; ++r)
        if (all[r * 8] != static_cast<std::byte>(r)) return 10;
      return 0;
    });
    for (std::size_t r = 0; r < 8; ++r) REQUIRE(res[r].code == 0);
    std::string keys;  // every key in the server (the test's own)
    FILE* scan = ::popen(fmt::format("redis-cli -p {} --scan", redis.port()).c_str(), "r");
    REQUIRE(scan);
    for (char buf[256]; std::fgets(buf, sizeof buf, scan);) keys += buf;
    CHECK(::pclose(scan) == 0);
    INFO(run << ": keys left in Redis: " << keys);
    CHECK(keys.empty());
  }
}

TEST_CASE("a Redis store that requires a password: none or a wrong one is refused naming the store, the right one meets",
          "[comm][gloo][redis][secret]") {
  const std::string password = "a-store-password-7f3a";
  redis_server redis(password);
  if (!redis.ready()) {
    WARN("redis-server not available (scripts/setup.sh installs it): Redis AUTH not tested");
    return;
  }
  const auto where = fmt::format("redis://127.0.0.1:{}", redis.port());
  auto join = [&](const std::string& pw, std::size_t n) {
    return sluice_test::run_ranks(n, [&](std::size_t rank) {
      comm::gloo_options o;
      o.store = comm::store_address::parse(where + "/auth");
      o.store.password = pw;
      o.timeout = 10s;
      try {
        comm::gloo c(rank, n, o);
        c.barrier();
        return 0;
      } catch (const config_error& e) {
        const std::string w = e.what();
        if (w.find(password) != std::string::npos) return 30;  // never echoed
        if (w.find(where) == std::string::npos) return 31;
        if (w.find("requires a password") != std::string::npos) return 20;
        if (w.find("refused the password") != std::string::npos) return 21;
        return 32;
      }
    });
  };
  for (const auto& r : join("", 1)) CHECK(r.code == 20);
  for (const auto& r : join("wrong", 1)) CHECK(r.code == 21);
  for (const auto& r : join(password, 3)) CHECK(r.code == 0);
  // From the environment: a password file others can read is refused, naming it (never its contents).
  const auto dir = sluice_test::fresh_dir("redis-pw");
  const auto file = dir / "pw";
  {
    std::ofstream(file) << password << "\n";
  }
  REQUIRE(::chmod(file.c_str(), 0644) == 0);
  CHECK_THROWS_WITH(comm::rank_info::read_password_file(file.string()),
                    Catch::Contains("mode 0644") && Catch::Contains(file.string()) && !Catch::Contains(password));
  REQUIRE(::chmod(file.c_str(), 0600) == 0);
  CHECK(comm::rank_info::read_password_file(file.string()) == password);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an unreachable Redis store is a comm_error naming it", "[comm][gloo][redis]") {
  comm::gloo_options o;
  o.store = comm::store_address::parse("redis://127.0.0.1:1/x");  // nothing listens on port 1
  o.timeout = 2s;
  try {
    comm::gloo c(0, 2, o);
    FAIL("rendezvous succeeded without a store");
  } catch (const comm::comm_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:1"));
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("needs sluice built with hiredis"));  // built without libhiredis-dev
  }
}

namespace {
void custom_sigpipe_handler(int) {}
}  // namespace

TEST_CASE("a dead peer cannot kill a rank with SIGPIPE, a process's own SIGPIPE handler is kept", "[comm][gloo]") {
  // Each case in a child of its own: the disposition is process-wide.
  // Codes: 0 as expected; 1 SIGPIPE not ignored; 2 a write to a closed socket
  // did not fail with EPIPE; 3 the process's handler was replaced.
  for (const bool own_handler : {false, true}) {
    INFO((own_handler ? "the process handles SIGPIPE itself" : "default disposition"));
    const auto dir = sluice_test::fresh_dir("gloo-sigpipe");
    const auto res = sluice_test::run_ranks(
        1,
        [&](std::size_t) {
          ::signal(SIGPIPE, own_handler ? custom_sigpipe_handler : SIG_DFL);
          auto c = connect(0, 1, dir);
          struct sigaction now {};
          ::sigaction(SIGPIPE, nullptr, &now);
          if (own_handler) return now.sa_handler == custom_sigpipe_handler ? 0 : 3;
          if (now.sa_handler != SIG_IGN) return 1;
          int sv[2];
          if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 2;
          ::close(sv[1]);
          const char byte = 0;
          const bool epipe = ::write(sv[0], &byte, 1) < 0 && errno == EPIPE;  // alive to tell
          ::close(sv[0]);
          return epipe ? 0 : 2;
        },
        30s);
    std::filesystem::remove_all(dir);
    CHECK(res[0].code == 0);
  }
}

namespace {
// A connection to rank 0's watch at `address` ("host|port") from the test.
int connect_to_watch(const std::string& address) {
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind('|') + 1)));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  return fd;
}
// The connector's side of the watch's handshake, as rank `me` to rank
// `peer`, proving `secret`; false if the watch closed on it.
bool greet(int fd, std::uint64_t me, std::uint64_t peer, const comm::load_secret& secret) {
  struct {
    std::uint64_t rank;
    comm::load_secret::nonce_t nonce;
  } g{me, comm::load_secret::nonce()};
  struct {
    comm::load_secret::nonce_t nonce;
    comm::load_secret::proof_t proof;
  } ans{};
  if (::send(fd, &g, sizeof g, MSG_NOSIGNAL) != sizeof g) return false;
  if (::recv(fd, &ans, sizeof ans, MSG_WAITALL) != sizeof ans) return false;
  const auto mine = secret.prove("sluice-watch", me, peer, g.nonce, ans.nonce);
  return ::send(fd, mine.data(), mine.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(mine.size());
}
}  // namespace

TEST_CASE("a peer-watch connection that sends an endless line is a lost peer, not unbounded memory",
          "[comm][gloo][watch]") {
  // Rank 0's watch, and in rank 1's place one that knows the load's secret:
  // it greets as rank 1, then sends bytes without a newline. The watch keeps
  // at most a line's worth of them and calls rank 1 lost, naming why.
  const auto secret = comm::load_secret::draw();
  comm::detail::peer_watch watch(0, 2, "127.0.0.1");
  const auto& a = watch.address();
  const int fd = connect_to_watch(a);
  std::thread peer([&] { REQUIRE(greet(fd, 1, 0, secret)); });
  watch.connect({a, "127.0.0.1|1"}, std::chrono::seconds(10), secret, {});
  peer.join();
  const std::string flood(64 * 1024, 'x');
  (void)::send(fd, flood.data(), flood.size(), MSG_NOSIGNAL);
  const auto v = watch.settle(std::chrono::seconds(20));
  REQUIRE(v.lost == std::optional<std::size_t>(1));
  CHECK_THAT(v.how, Catch::Contains("without a newline"));
  ::close(fd);
}

TEST_CASE("a watch that knows a peer died says so as its last word, not done", "[comm][gloo][watch]") {
  // Rank 0's watch in a world of 3; in the places of ranks 1 and 2, sockets
  // that know the load's secret. Rank 1's connection ends without a word (a
  // death). The watch then goes, as a communicator goes after its liveness
  // check threw outside any collective: rank 2 must hear "lost 1", which
  // tells it why rank 0's pairs close next, and not "done".
  const auto secret = comm::load_secret::draw();
  std::optional<comm::detail::peer_watch> watch(std::in_place, 0, 3, "127.0.0.1");
  const auto a = watch->address();
  const int one = connect_to_watch(a), two = connect_to_watch(a);
  bool greeted = false;
  std::thread peers([&] { greeted = greet(one, 1, 0, secret) && greet(two, 2, 0, secret); });
  watch->connect({a, "127.0.0.1|1", "127.0.0.1|2"}, std::chrono::seconds(10), secret, {});
  peers.join();
  REQUIRE(greeted);
  ::close(one);
  const auto v = watch->settle(std::chrono::seconds(20));
  REQUIRE(v.lost == std::optional<std::size_t>(1));
  watch.reset();
  std::string heard;
  char b[64];
  for (ssize_t n; (n = ::recv(two, b, sizeof b, 0)) > 0;) heard.append(b, static_cast<std::size_t>(n));
  CHECK(heard == "lost 1\n");
  ::close(two);
}

TEST_CASE("a connection to the peer watch that does not prove the load's secret is refused, and the watch goes on",
          "[comm][gloo][watch][secret]") {
  // Before rank 1 connects: a stranger greeting as rank 1 with another
  // secret, one greeting as a rank that is no peer, and one that says nothing
  // (refused after its 5 s). Each is closed; the real rank 1 is then accepted.
  const auto secret = comm::load_secret::draw(), other = comm::load_secret::draw();
  comm::detail::peer_watch watch(0, 2, "127.0.0.1");
  const auto& a = watch.address();
  const int wrong = connect_to_watch(a), nobody = connect_to_watch(a), silent = connect_to_watch(a), real = connect_to_watch(a);
  std::vector<std::string> warned;
  bool wrong_answered = true, nobody_answered = true, real_answered = false;
  std::thread peers([&] {
    wrong_answered = greet(wrong, 1, 0, other);  // its proof is checked last: the watch answers, then closes
    nobody_answered = greet(nobody, 7, 0, secret);
    real_answered = greet(real, 1, 0, secret);
  });
  watch.connect({a, "127.0.0.1|1"}, std::chrono::seconds(30), secret, [&](const std::string& m) { warned.push_back(m); });
  peers.join();
  CHECK(watch.refused() == 3);
  REQUIRE(warned.size() == 1);  // reported once
  CHECK_THAT(warned[0], Catch::Contains("refused a connection from 127.0.0.1:") && Catch::Contains("did not prove the load's secret"));
  CHECK_FALSE(nobody_answered);
  CHECK(real_answered);
  (void)wrong_answered;
  char b;
  for (int fd : {wrong, nobody, silent}) {
    CHECK(::recv(fd, &b, 1, 0) <= 0);  // closed by the watch
    ::close(fd);
  }
  // The real rank 1 is rank 0's peer: its last word reaches the watch.
  const std::string done = "done\n";
  REQUIRE(::send(real, done.data(), done.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(done.size()));
  ::shutdown(real, SHUT_WR);
  const auto v = watch.settle(std::chrono::seconds(20));
  CHECK_FALSE(v.lost.has_value());
  ::close(real);
}

namespace {
// A view of a shared kv_store that gives its rank another secret than the
// one rank 0 set: a process that joined the rendezvous (it knows every
// address) but is not of the load.
class lying_store final : public comm::kv_store {
 public:
  explicit lying_store(std::shared_ptr<comm::kv_store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<char>& value) override { s_->set(key, value); }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto v = s_->get(key, timeout);
    if (key.ends_with("sluice-secret"))
      for (auto& c : v) c = static_cast<char>(c ^ 0x5a);
    return v;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override { s_->wait(keys, timeout); }
  void erase(const std::string& key) override { s_->erase(key); }

 private:
  std::shared_ptr<comm::kv_store> s_;
};
}  // namespace

TEST_CASE("a rank that does not know the load's secret makes the rendezvous fail naming its pair, before any byte",
          "[comm][gloo][secret]") {
  auto store = std::make_shared<memory_store>();
  std::vector<std::string> errors(3);
  std::vector<int> collectives(3, 0);
  std::vector<std::thread> ranks;
  for (std::size_t rank = 0; rank < 3; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        comm::rank_info who;
        who.hostname = "127.0.0.1";
        who.rank = rank;
        who.world_size = 3;
        who.timeout = 10s;
        who.kv = rank == 2 ? std::make_shared<lying_store>(store) : std::shared_ptr<comm::kv_store>(store);
        comm::gloo c(who);
        collectives[rank] = 1;  // never: the proof is part of the rendezvous
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(collectives[r] == 0);
    REQUIRE_FALSE(errors[r].empty());
  }
  // Every rank names the pairs that failed: the others name the impostor,
  // the impostor names them.
  CHECK_THAT(errors[0], Catch::Contains("the Gloo pair with rank 2 did not prove the load's secret"));
  CHECK_THAT(errors[1], Catch::Contains("the Gloo pair with rank 2 did not prove the load's secret"));
  CHECK_THAT(errors[2], Catch::Contains("the Gloo pair with rank 0, rank 1 did not prove the load's secret"));
  CHECK(store->keys_left() == 0);
}

TEST_CASE("a world across nodes with no address set is refused before it listens", "[comm][gloo][address]") {
  comm::rank_info who;
  who.rank = 0;
  who.world_size = 8;
  who.local_size = 4;   // two nodes
  who.store_dir = "/nonexistent";
  try {
    (void)comm::gloo_options::from(who);
    FAIL("accepted");
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("SLUICE_GLOO_HOST") && Catch::Contains("127.0.0.1"));
  }
  who.local_size = 8;   // one node: loopback is right
  CHECK(comm::gloo_options::from(who).hostname == "127.0.0.1");
  who.local_size = 4;
  who.hostname = "127.0.0.1";   // said on purpose: nodes simulated on one machine
  CHECK(comm::gloo_options::from(who).hostname == "127.0.0.1");
}

// The ranks of a group each make its store's subdirectory and check it at
// once: one rank's check must never see the directory another is still
// making (made with the umask's mode and closed after, a rank found it
// 0755 under CPU load and refused it).
TEST_CASE("ranks making the same private directory at once never see it open to others", "[comm][gloo][secret]") {
  const auto dir = sluice_test::fresh_dir("store-race");
  constexpr int threads = 6, rounds = 2000;
  std::atomic<int> arrived{0}, refused{0};
  std::mutex mu;
  std::string first;
  for (int round = 0; round < rounds; ++round) {
    const auto made = (dir / fmt::format("r{}", round) / "group-trio").string();
    arrived = 0;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&] {
        arrived.fetch_add(1);
        while (arrived.load() < threads) std::this_thread::yield();  // all at once
        try {
          comm::make_private_dir(made);
          comm::check_private_dir(made);
        } catch (const std::exception& e) {
          refused.fetch_add(1);
          std::lock_guard l(mu);
          if (first.empty()) first = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
  }
  INFO(first);
  REQUIRE(refused.load() == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a store directory others can read or write, or another user's, is refused, naming it", "[comm][gloo][secret]") {
  const auto dir = sluice_test::fresh_dir("store-perms");  // mkdtemp: 0700, this user's
  auto join = [&] { (void)connect(0, 1, dir, 5s); };
  REQUIRE_NOTHROW(join());
  for (auto mode : {0755, 0770, 0701}) {
    INFO("mode " << std::oct << mode);
    REQUIRE(::chmod(dir.c_str(), static_cast<mode_t>(mode)) == 0);
    try {
      join();
      FAIL("a store directory of mode " << std::oct << mode << " was accepted");
    } catch (const config_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(dir.string()) && Catch::Contains(fmt::format("mode {:04o}", mode)) &&
                               Catch::Contains("chmod 700"));
    }
  }
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  if (::geteuid() == 0) {  // another owner (root can hand it to nobody)
    REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
    try {
      join();
      FAIL("another user's store directory was accepted");
    } catch (const config_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(dir.string()) && Catch::Contains("belongs to uid 65534"));
    }
    REQUIRE(::chown(dir.c_str(), 0, 0) == 0);
  }
  // sluice-launch's own store, and a prefix's subdirectory: made 0700 whatever the umask.
  const auto made = dir / "a" / "b";
  const auto old = ::umask(0);
  comm::make_private_dir(made.string());
  ::umask(old);
  for (const auto& p : {dir / "a", made}) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
  }
  std::filesystem::remove_all(dir);
}
