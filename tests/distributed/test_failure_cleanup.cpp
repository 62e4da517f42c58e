// Cleanup after a failed distributed load (issue 14, item 6). For each way a
// load can fail — a rank killed mid-load (SIGKILL), a corrupt shard on one
// rank, a sink that throws on one rank, an S3 object deleted mid-load — every
// rank that survives throws the expected typed error; then, in each survivor,
// what the load made is gone: its descriptors, its threads and its shared
// segments (sluice_test::footprint, counted inside the rank, by the load's
// own segment name), and, once every rank has ended, its rendezvous keys (the
// files of its own file-store directory). Then a new load on a fresh
// communicator in the same processes succeeds and leaves nothing either.
//
// Each load joins its world through its own store directory (so its keys
// are told apart from the next load's) and names its segment uniquely (so no
// other process's memory counts). Nothing here depends on timing: the
// failures happen at a fixed sink call, and every communicator timeout is
// far above what a busy machine takes. Whether a survivor had mapped the
// segment (else its absence afterwards would prove nothing) is seen by the
// rank that fails on purpose, in every peer's /proc/<pid>/maps, at the call
// where it fails: every rank has attached the segment before any sink call,
// and none lets go of it before that failure. (A survivor's own count at its
// n-th call is not enough: a peer killed at its 5th call may end the load
// before a descheduled survivor makes its 5th.)
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include <sluice/distributed.hpp>
#include <sluice/testing/generator.hpp>
#if defined(SLUICE_TEST_S3)
#include <sluice/s3/client.hpp>
#include <sluice/s3/distributed.hpp>
#include "source/s3_test_support.hpp"
#endif

#include "comm/multiprocess.hpp"
#include "comm/recording_sink.hpp"
#include "distributed/small_load.hpp"
#include "support/footprint.hpp"

using namespace sluice;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const fs::path& checkpoint_dir() {
  static const fs::path dir = sluice_test::write_small_checkpoint("cleanup-ckpt");
  return dir;
}

// Written at the test process's start, before any rank forks: the ranks share
// it, and the test process removes it at exit (a rank that wrote its own
// would leave it behind, ranks end in _exit).
[[maybe_unused]] const fs::path& shared_checkpoint = checkpoint_dir();

using sluice_test::small_options;

// The test's output directory, set before the ranks are forked: each rank
// writes its pid there (pid<r>), and the rank that fails on purpose writes
// what it saw of each peer's segment mappings (mapped<r>).
fs::path& out_dir() {
  static fs::path dir;
  return dir;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Counts every peer's mappings of `segment` now, and writes them down.
void witness_peers(std::size_t self, std::size_t n, const std::string& segment) {
  for (std::size_t r = 0; r < n; ++r) {
    if (r == self) continue;
    const auto pid = read_text(out_dir() / fmt::format("pid{}", r));
    const auto maps = sluice_test::footprint::segment_maps_in(fs::path("/proc") / pid / "maps", segment);
    std::ofstream(out_dir() / fmt::format("mapped{}", r)) << maps;
  }
}

// What the failing rank saw of `rank`'s segment mappings (0: nothing written).
std::size_t witnessed(std::size_t rank) {
  const auto text = read_text(out_dir() / fmt::format("mapped{}", rank));
  return text.empty() ? 0 : std::stoul(text);
}

// A rank's world for one load: its own store directory.
comm::rank_info world(std::size_t rank, std::size_t n, const fs::path& store) {
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n;
  who.store_dir = store.string();
  who.timeout = 30s;  // a dead peer is seen by its closed sockets, long before this
  return who;
}

// Calls `at_call` at the sink's `n`-th call (metadata placeholders count:
// every rank's sink gets the same sequence), else records like recording_sink.
// At that call it also counts the mappings of the load's segment, so that a
// test knows the load had made one (and its absence afterwards means
// something); a rank with an `at_call` first counts its peers' (of `ranks`).
struct failing_sink {
  int n = 0, calls = 0;
  std::size_t rank = 0, ranks = 4;
  std::string segment;
  std::size_t segment_maps = 0;  // at call n
  std::function<void()> at_call;
  sluice_test::recording_sink inner;
  bool accept(tensor_view v) {
    if (++calls == n) {
      segment_maps = sluice_test::footprint::now(segment).segment_maps;
      if (at_call) {
        witness_peers(rank, ranks, segment);
        at_call();
      }
    }
    return inner.accept(std::move(v));
  }
  // Whether the load had mapped its segment: by this rank's own count at its
  // n-th call, or by the failing rank's count of it.
  [[nodiscard]] bool saw_segment() const { return segment_maps > 0 || witnessed(rank) > 0; }
};

struct sink_failure : error {
  using error::error;
};

// Rank exit codes.
constexpr int ok = 0, wrong_error = 20, leaked = 21, reload_failed = 22, reload_leaked = 23, no_error = 24;

// One failure kind, run by `n` forked ranks:
// - `fail(rank, segment, store)`: the failing load, which must throw; returns
//   "expected" when what it threw is what that rank expects, else what it was;
// - `reload(rank, survivors, segment, store)`: the new load among the
//   survivors (renumbered 0 .. survivors-1), which must succeed.
// `victim`: a rank that is killed (checked only for that).
struct scenario {
  std::string tag;
  std::size_t n = 4;
  int victim = -1;
  std::function<std::string(std::size_t, const std::string&, const fs::path&)> fail;
  std::function<void(std::size_t, std::size_t, const std::string&, const fs::path&)> reload;
};

void run(const scenario& sc) {
  const auto base = sluice_test::fresh_dir("cleanup-" + sc.tag);
  const auto store1 = base / "load-1", store2 = base / "load-2", out = base / "out";
  comm::make_private_dir(store1.string()), comm::make_private_dir(store2.string()), fs::create_directories(out);
  const auto name = fmt::format("sluice-cleanup-{}-{}", ::getpid(), sc.tag);
  const std::size_t survivors = sc.n - (sc.victim >= 0 ? 1 : 0);
  out_dir() = out;
  const auto res = sluice_test::run_ranks(
      sc.n,
      [&](std::size_t rank) {
        std::ofstream(out / fmt::format("pid{}", rank)) << ::getpid();
        std::ofstream log(out / fmt::format("rank{}.txt", rank));
        const auto seg1 = name + "-1", seg2 = name + "-2";
        sluice_test::footprint::start_runtime_threads();
        const auto before = sluice_test::footprint::now(seg1);
        log << "before: " << before.str() << "\n";
        const auto why = sc.fail(rank, seg1, store1);
        log << "failed load: " << why << "\n";
        if (why != "expected") return why == "no error" ? no_error : wrong_error;
        const auto after = sluice_test::footprint::now(seg1);
        log << "after the failed load: " << after.str() << "\n";
        if (!after.same_counts(before) || after.segment_fds || after.segment_maps || after.shm_entries) return leaked;
        // The survivors are the ranks of a new world, the victim's rank number left out.
        const std::size_t r2 = sc.victim >= 0 && rank > static_cast<std::size_t>(sc.victim) ? rank - 1 : rank;
        try {
          sc.reload(r2, survivors, seg2, store2);
        } catch (const std::exception& e) {
          log << "new load: " << e.what() << "\n";
          return reload_failed;
        }
        const auto again = sluice_test::footprint::now(seg2);
        log << "after the new load: " << again.str() << "\n";
        if (!again.same_counts(before) || again.segment_fds || again.segment_maps || again.shm_entries) return reload_leaked;
        return ok;
      },
      240s);
  std::string keys1, keys2;
  const auto left1 = sluice_test::store_keys(store1, &keys1), left2 = sluice_test::store_keys(store2, &keys2);
  for (std::size_t r = 0; r < sc.n; ++r) {
    if (static_cast<int>(r) == sc.victim) {
      CHECK(res[r].code == -SIGKILL);
      continue;
    }
    const auto text = read_text(out / fmt::format("rank{}.txt", r));
    INFO(sc.tag << ", rank " << r << " (20: wrong error, 21: left something after the failed load, 22: new load failed, "
                << "23: left something after the new load, 24: no error; timed out: " << res[r].timed_out << ")\n"
                << text);
    CHECK(res[r].code == ok);
  }
  // Every key a rank set in the store was removed once no peer needed it.
  INFO(sc.tag << ": keys left by the failed load: " << keys1 << "; by the new load: " << keys2);
  CHECK(left1 == 0);
  CHECK(left2 == 0);
  fs::remove_all(base);
}

// A good load of the local checkpoint among `n` ranks.
void good_load(std::size_t rank, std::size_t n, const std::string& segment, const fs::path& store) {
  sluice_test::recording_sink s;
  const auto topo = fmt::format("tp1,dp{},ep{}", n, n % 2 == 0 ? n : 1);
  const auto st = load_distributed(checkpoint_dir(), topo, "shared-cooperative", world(rank, n, store), s, small_options(segment));
  if (s.calls.size() != checkpoint::open(checkpoint_dir()).tensors().size() || st.owned == 0)
    throw std::runtime_error(fmt::format("the new load delivered {} calls, {} owned", s.calls.size(), st.owned));
}

// The failed load's error, checked: "expected", or what it was instead; and
// whether the load had mapped its segment by the sink's n-th call (else the
// test would check the absence of something that never was).
template <class Expected, class Check>
std::string expect(const failing_sink& s, const std::function<void()>& load, Check check) {
  try {
    load();
  } catch (const Expected& e) {
    if (!check(e)) return std::string("unexpected message: ") + e.what();
    return s.saw_segment() ? "expected" : "the load had not mapped its segment";
  } catch (const std::exception& e) {
    return std::string("unexpected type: ") + e.what();
  }
  return "no error";
}

}  // namespace

// Rank 3 of 4 SIGKILLed at its 5th sink call of a tp1,dp4,ep4 load
// (`offload`, the options `tweak` changes); the others must throw `Expected`
// passing `check`; then the survivors load again.
template <class Expected, class Check>
scenario killed(std::string tag, const char* offload, void (*tweak)(distributed_options&), Check check) {
  scenario sc;
  sc.tag = std::move(tag);
  sc.victim = 3;
  sc.fail = [offload, tweak, check](std::size_t rank, const std::string& segment, const fs::path& store) {
    failing_sink s{.n = 5, .rank = rank, .segment = segment};
    if (rank == 3) s.at_call = [] { ::kill(::getpid(), SIGKILL); };
    auto o = small_options(segment);
    tweak(o);
    return expect<Expected>(
        s, [&] { (void)load_distributed(checkpoint_dir(), "tp1,dp4,ep4", offload, world(rank, 4, store), s, o); }, check);
  };
  sc.reload = good_load;
  return sc;
}

TEST_CASE("a rank killed mid-load: the others throw comm_error and leave nothing behind", "[distributed][cleanup]") {
  run(killed<comm::comm_error>("killed", "shared-cooperative", [](distributed_options&) {},
                               [](const comm::comm_error&) { return true; }));
}

TEST_CASE("a rank killed mid-load through the node window: the others throw peer_lost naming it and leave no window behind",
          "[distributed][cleanup][node_window]") {
  // Without the page cache (as from S3), the node's ranks share a node
  // window (a memfd named after the segment); a rank killed between its
  // windows must not leave it mapped or open in any survivor.
  run(killed<comm::peer_lost>("killed-window", "none", [](distributed_options& o) { o.page_cache = false; },
                              [](const comm::peer_lost& e) { return e.lost_rank() == 3; }));
  // Overlapped: a survivor may be waiting for the node window's parity
  // (parity_gate) when the status exchange finds rank 3 gone.
  run(killed<comm::peer_lost>("killed-window-overlap", "none",
                              [](distributed_options& o) {
                                o.page_cache = false;
                                o.overlap = distributed_options::overlap_mode::on;
                              },
                              [](const comm::peer_lost& e) { return e.lost_rank() == 3; }));
}

TEST_CASE("a corrupt shard on one rank: every rank throws distributed_error naming it and leaves nothing behind",
          "[distributed][cleanup]") {
  const auto ck = checkpoint::open(checkpoint_dir());
  auto o = small_options("plan");
  o.plan.local_size = 4;
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", o);
  // A shard that rank 1 reads from, none of it before window 1 (no shared
  // table, read before the windows; nothing in window 0): the load is under
  // way, its segment made and the sink called, when the read fails.
  std::map<std::string, bool> late;  // shard: all of it read in window 1 or later
  std::set<std::string> read_by_1;
  for (const auto& e : plan.entries) {
    const auto& name = ck.shards()[ck.tensors()[e.index].shard].name;
    const bool l = !e.shared() && e.window > 0;
    late[name] = late.contains(name) ? late[name] && l : l;
    for (const auto& r : e.reads)
      if (r.reader == 1 && r.size) read_by_1.insert(name);
  }
  std::string victim;
  for (const auto& name : read_by_1)
    if (late[name] && victim.empty()) victim = name;
  REQUIRE_FALSE(victim.empty());
  std::uint64_t keep = 0;  // cut right after its header
  for (const auto& sh : ck.shards())
    if (sh.name == victim) keep = sh.header.data_start();
  const auto copy = sluice_test::fresh_dir("cleanup-bad");
  for (auto& f : fs::directory_iterator(checkpoint_dir())) fs::copy_file(f.path(), copy / f.path().filename());
  scenario sc;
  sc.tag = "corrupt";
  sc.fail = [&](std::size_t rank, const std::string& segment, const fs::path& store) {
    auto mine = checkpoint::open(rank == 1 ? copy : checkpoint_dir());
    if (rank == 1) fs::resize_file(copy / victim, keep);  // cut short after its header was read
    failing_sink s{.n = 1, .rank = rank, .segment = segment};
    return expect<distributed_error>(
        s, [&] { (void)load_distributed(mine, "tp1,dp4,ep4", "shared-cooperative", world(rank, 4, store), s, small_options(segment)); },
        [&](const distributed_error& e) {
          const std::string m = e.what();
          return e.failed_rank() == 1 && m.find(victim) != std::string::npos;
        });
  };
  sc.reload = good_load;
  run(sc);
  fs::remove_all(copy);
}

TEST_CASE("a sink that throws on one rank: every rank throws distributed_error naming it and leaves nothing behind",
          "[distributed][cleanup]") {
  scenario sc;
  sc.tag = "sink";
  sc.fail = [](std::size_t rank, const std::string& segment, const fs::path& store) {
    failing_sink s{.n = 5, .rank = rank, .segment = segment};
    if (rank == 2) s.at_call = [] { throw sink_failure("the engine refused this weight"); };
    return expect<distributed_error>(
        s, [&] { (void)load_distributed(checkpoint_dir(), "tp1,dp4,ep4", "shared-cooperative", world(rank, 4, store), s, small_options(segment)); },
        [](const distributed_error& e) {
          const std::string m = e.what();
          return e.failed_rank() == 2 && m.find("the engine refused this weight") != std::string::npos;
        });
  };
  sc.reload = good_load;
  run(sc);
}

#if defined(SLUICE_TEST_S3)
namespace {
// Uploads the local checkpoint under `prefix` of `bucket`.
task<void> upload_dir(s3::client& c, std::string bucket, std::string prefix, bool create) {
  if (create) co_await c.create_bucket(bucket);
  for (const auto& f : fs::directory_iterator(checkpoint_dir())) {
    std::ifstream in(f.path(), std::ios::binary);
    const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> body(chars.size());
    std::memcpy(body.data(), chars.data(), chars.size());
    (void)co_await c.put(bucket, prefix + f.path().filename().string(), body);
  }
}
s3::config s3_config() {
  auto c = sluice_test::test_config(sluice_test::servers().http);
  c.max_connections = 4;
  return c;
}
}  // namespace

TEST_CASE("an S3 object deleted mid-load: every rank throws distributed_error naming the object and leaves nothing behind",
          "[distributed][cleanup][s3]") {
  REQUIRE_S3_SERVERS();
  REQUIRE(sluice_test::python_has_module("boto3"));  // the project's Python environment
  const auto bucket = sluice_test::unique_bucket("cleanup");
  {
    asio::io_context ioc;
    s3::client c(ioc.get_executor(), s3_config());
    run_blocking(ioc, upload_dir(c, bucket, "doomed/", true));
    run_blocking(ioc, upload_dir(c, bucket, "ck/", false));
  }
  // The object read last: its bytes are read in a later window than the
  // first sink call, which deletes it.
  const auto ck = checkpoint::open(checkpoint_dir());
  auto o = small_options("plan");
  o.plan.local_size = 4;
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", o);
  const auto& last = plan.entries.back();
  const auto victim = ck.shards()[ck.tensors()[last.index].shard].name;
  REQUIRE(plan.windows >= 4);
  std::uint32_t first_window = plan.windows;
  for (const auto& e : plan.entries)
    if (ck.shards()[ck.tensors()[e.index].shard].name == victim) {
      REQUIRE_FALSE(e.shared());  // shared tables are read before the windows
      first_window = std::min(first_window, e.window);
    }
  REQUIRE(first_window >= 3);  // window 0 is delivered before it is read, overlapped or not
  const std::string key = "doomed/" + victim;
  scenario sc;
  sc.tag = "s3";
  sc.fail = [&](std::size_t rank, const std::string& segment, const fs::path& store) {
    failing_sink s{.n = 1, .rank = rank, .segment = segment};
    if (rank == 0)
      s.at_call = [&] {
        if (!sluice_test::delete_object(bucket, key)) throw std::runtime_error("delete_object failed");
      };
    return expect<distributed_error>(
        s,
        [&] {
          (void)load_distributed(s3_location("s3://" + bucket + "/doomed/", s3_config()), "tp1,dp4,ep4", "shared-cooperative",
                                 world(rank, 4, store), s, small_options(segment));
        },
        [&](const distributed_error& e) { return std::string(e.what()).find(key) != std::string::npos; });
  };
  sc.reload = [&](std::size_t rank, std::size_t n, const std::string& segment, const fs::path& store) {
    sluice_test::recording_sink s;
    const auto st = load_distributed(s3_location("s3://" + bucket + "/ck/", s3_config()), "tp1,dp4,ep4", "shared-cooperative",
                                     world(rank, n, store), s, small_options(segment));
    if (s.calls.size() != checkpoint::open(checkpoint_dir()).tensors().size() || st.owned == 0)
      throw std::runtime_error("the new load delivered too little");
  };
  run(sc);
}
#endif
