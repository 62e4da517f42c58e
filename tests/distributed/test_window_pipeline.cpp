// The window pipeline of a distributed load (read_window | exchange_window |
// deliver_window), observed from one process: where each step runs, in which
// order, and how far reads run ahead of deliveries.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sluice/distributed.hpp>
#include <fmt/format.h>

#include <sluice/policy/schedule.hpp>
#include <sluice/sink/callback_sink.hpp>
#include <sluice/sink/discard_sink.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/source/any_source.hpp>
#include <sluice/testing/emulated_device_lane.hpp>
#include <sluice/testing/generator.hpp>

#include "comm/multiprocess.hpp"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

// Written once per test process and removed at its exit.
const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    auto d = sluice_test::process_dir("window-pipeline");
    testing::generator_options o;
    o.experts = 4;
    o.layers = 3;
    o.engram_rows = 1024;
    o.max_shard_bytes = 128u << 10;
    testing::write_checkpoint(d, o);
    return d;
  }();
  return dir;
}

distributed_options many_windows(bool overlap) {
  distributed_options o;
  o.load.staging_budget = 8u << 20;
  o.load.max_read = 1u << 20;
  o.load.register_buffers = false;
  o.plan.window_bytes = 64u << 10;
  o.overlap = overlap ? distributed_options::overlap_mode::on : distributed_options::overlap_mode::off;
  // One rank: no window carries a message, and only the last would exchange
  // status (and call the communicator's exchange). These tests watch each
  // window go through every stage: every window does.
  o.status_every = 0;
  return o;
}

// What happened, in order, from every thread.
struct event_log {
  std::mutex m;
  std::vector<std::pair<std::string, std::uint32_t>> events;  // (what, window)
  std::thread::id driver = std::this_thread::get_id();
  std::set<std::thread::id> exchange_threads;
  std::set<std::thread::id> read_threads, deliver_threads;
  void add(std::string what, std::uint32_t w) {
    std::lock_guard lock(m);
    events.emplace_back(std::move(what), w);
  }
  // Index of the first / last event (what, w); -1 when absent.
  long first(const std::string& what, std::uint32_t w) {
    for (std::size_t i = 0; i < events.size(); ++i)
      if (events[i].first == what && events[i].second == w) return static_cast<long>(i);
    return -1;
  }
  long last(const std::string& what, std::uint32_t w) {
    for (std::size_t i = events.size(); i-- > 0;)
      if (events[i].first == what && events[i].second == w) return static_cast<long>(i);
    return -1;
  }
};

// comm::local, logging each window's exchange and the thread it runs on.
struct logging_comm {
  comm::local inner;
  event_log* log;
  std::uint32_t exchanges = 0;
  [[nodiscard]] std::size_t rank() const noexcept { return 0; }
  [[nodiscard]] std::size_t size() const noexcept { return 1; }
  void broadcast(std::span<std::byte> b, std::size_t root) { inner.broadcast(b, root); }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) { inner.all_gather(in, out); }
  void all_gather_v(std::span<std::byte> b, std::span<const std::size_t> counts) { inner.all_gather_v(b, counts); }
  void exchange(std::span<const comm::send_message> s, std::span<const comm::recv_message> r) {
    {
      std::lock_guard lock(log->m);
      log->exchange_threads.insert(std::this_thread::get_id());
    }
    log->add("exchange", exchanges++);
    // A peer's exchange takes time; one rank's own is instant. Without this,
    // the exchange could finish (and the window be delivered) before the
    // next window's first read was even issued, and whether reads overlap
    // the exchange would be a race, not what the tests observe.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inner.exchange(s, r);
  }
  void barrier() { inner.barrier(); }
};
static_assert(comm::communicator<logging_comm>);

// The checkpoint's own source, logging the window of the tensor each read
// starts in (a read covers extents of one batch: one window) and its thread.
struct logging_source {
  std::unique_ptr<any_source> inner;
  event_log* log;
  const policy::load_plan* plan;
  const checkpoint* ck;
  [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    for (const auto& e : plan->entries) {
      const auto& t = ck->tensors()[e.index];
      if (t.shard == file && t.offset <= offset && offset < t.offset + t.size) log->add(e.shared() ? "tables" : "read", e.window);
    }
    {
      std::lock_guard lock(log->m);
      log->read_threads.insert(std::this_thread::get_id());
    }
    return inner->read_at(file, offset, dst);
  }
  [[nodiscard]] std::size_t file_count() const { return inner->file_count(); }
  [[nodiscard]] std::string file_uri(std::uint32_t file) const { return inner->file_uri(file); }
  [[nodiscard]] const io_counters& counters() const noexcept { return inner->counters(); }
};
static_assert(source<logging_source>);

// Digests what arrives and logs the window of each delivery.
struct logging_sink {
  digest_sink digests;
  event_log* log;
  std::map<std::string, std::uint32_t> window_of;
  bool accept(tensor_view v) {
    log->add("deliver", window_of.at(v.name()));
    {
      std::lock_guard lock(log->m);
      log->deliver_threads.insert(std::this_thread::get_id());
    }
    if (v.kind != view_kind::bytes) return true;
    return digests.accept(std::move(v));
  }
};

struct run_result {
  distributed_stats st;
  std::uint32_t windows = 0;
  std::map<std::string, std::string> digests;
};

run_result run(event_log& log, bool overlap) {
  const auto ck = checkpoint::open(checkpoint_dir());
  const auto opt = many_windows(overlap);
  const auto plan = plan_for(ck, "tp1,dp1,ep1", "per-rank", opt);
  logging_comm c{{}, &log};
  logging_sink s{{}, &log, {}};
  for (const auto& e : plan.entries) s.window_of[e.info.name] = e.window;
  run_result r;
  r.st = load_distributed_with(ck, c, plan, s, opt, [&](asio::io_context& ioc) {
    return std::make_unique<logging_source>(logging_source{ck.storage().open_source(ck, ioc, opt.load.source()), &log, &plan, &ck});
  });
  r.windows = plan.windows;
  for (auto& [n, d] : s.digests.digests()) r.digests[n] = d.sha256;
  return r;
}

// The emulated device lane, recording which thread makes each call.
struct thread_recording_lane {
  testing::emulated_device_lane<comm::local> inner;
  std::mutex m;
  std::map<std::string, std::set<std::thread::id>> threads;
  explicit thread_recording_lane(comm::local& c) : inner(c) {}
  void note(const std::string& what) {
    std::lock_guard lock(m);
    threads[what].insert(std::this_thread::get_id());
  }
  lease host_buffer(unsigned slot, std::size_t n) {
    note("host_buffer");
    return inner.host_buffer(slot, n);
  }
  lease device_buffer(unsigned slot, std::size_t n) {
    note("device_buffer");
    return inner.device_buffer(slot, n);
  }
  void upload(std::span<std::byte> dst, std::span<const std::byte> src) {
    note("upload");
    inner.upload(dst, src);
  }
  void exchange(std::span<const comm::send_message> s, std::span<const comm::recv_message> r) {
    note("exchange");
    inner.exchange(s, r);
  }
};
static_assert(device_lane<thread_recording_lane>);

// Digests device views too (the emulated lane's are host memory).
struct device_digest_sink {
  static constexpr bool device_views = true;
  digest_sink digests;
  std::uint64_t device = 0;
  bool accept(tensor_view v) {
    if (v.kind == view_kind::device) v.kind = view_kind::bytes, device += 1;
    if (v.kind != view_kind::bytes) return true;
    return digests.accept(std::move(v));
  }
};

std::map<std::string, std::string> reference_digests() {
  const auto ck = checkpoint::open(checkpoint_dir());
  digest_sink d;
  load_options lo;
  lo.register_buffers = false;
  (void)load(ck, d, lo);
  std::map<std::string, std::string> m;
  for (auto& [n, t] : d.digests()) m[n] = t.sha256;
  return m;
}

}  // namespace

TEST_CASE("overlapped: every exchange runs on one long-lived thread, not the reading one", "[distributed][pipeline]") {
  event_log log;
  const auto r = run(log, true);
  REQUIRE(r.windows >= 4);
  REQUIRE(r.st.overlapped);
  REQUIRE(r.digests == reference_digests());
  REQUIRE(log.exchange_threads.size() == 1);  // one thread for every window, not one per window
  REQUIRE_FALSE(log.exchange_threads.contains(log.driver));
  // Reads and deliveries stay on the caller's thread: the exchange stage resumes there.
  REQUIRE(log.read_threads == std::set{log.driver});
  REQUIRE(log.deliver_threads == std::set{log.driver});
}

TEST_CASE("overlapped: reads run at most one window ahead of deliveries", "[distributed][pipeline]") {
  event_log log;
  const auto r = run(log, true);
  REQUIRE(r.windows >= 4);
  for (std::uint32_t w = 0; w < r.windows; ++w) {
    INFO("window " << w);
    REQUIRE(log.first("read", w) >= 0);
    REQUIRE(log.first("exchange", w) > log.last("read", w));     // a window travels once read
    REQUIRE(log.first("deliver", w) > log.first("exchange", w));  // and is delivered once it travelled
    // Two windows' buffers at most: w + 2 is read only after w was delivered.
    if (w + 2 < r.windows) REQUIRE(log.first("read", w + 2) > log.last("deliver", w));
  }
  // And the overlap is real: some window is read before the previous one is delivered.
  bool ahead = false;
  for (std::uint32_t w = 0; w + 1 < r.windows; ++w) ahead = ahead || log.first("read", w + 1) < log.first("deliver", w);
  REQUIRE(ahead);
}

TEST_CASE("serial: each window is read, exchanged and delivered before the next is read, on one thread",
          "[distributed][pipeline]") {
  event_log log;
  const auto r = run(log, false);
  REQUIRE(r.windows >= 4);
  REQUIRE_FALSE(r.st.overlapped);
  REQUIRE(r.digests == reference_digests());
  REQUIRE(log.exchange_threads == std::set{log.driver});
  for (std::uint32_t w = 0; w + 1 < r.windows; ++w) {
    INFO("window " << w);
    REQUIRE(log.first("exchange", w) > log.last("read", w));
    REQUIRE(log.first("deliver", w) > log.first("exchange", w));
    REQUIRE(log.first("read", w + 1) > log.last("deliver", w));
  }
}

TEST_CASE("a sink that throws stops the load at the next status exchange, naming the tensor's error",
          "[distributed][pipeline]") {
  for (const bool overlap : {false, true}) {
    INFO((overlap ? "overlapped" : "serial"));
    const auto ck = checkpoint::open(checkpoint_dir());
    const auto opt = many_windows(overlap);
    const auto plan = plan_for(ck, "tp1,dp1,ep1", "per-rank", opt);
    REQUIRE(plan.windows >= 4);
    comm::local c;
    std::size_t calls = 0;
    auto thrower = [&](tensor_view) -> bool {
      if (++calls == 2) throw config_error("the sink is full");
      return true;
    };
    callback_sink s(thrower);
    try {
      (void)load_distributed(ck, c, plan, s, opt);
      FAIL("no error");
    } catch (const distributed_error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains("rank 0 failed") && Catch::Contains("the sink is full"));
    }
    REQUIRE(calls == 2);  // never called again after it threw
    REQUIRE(plan.entries.size() > 2);
  }
}

TEST_CASE("a multi-rank load in a program that does not link sluice::gloo names the component to link", "[distributed][world]") {
  // This executable links the core alone: nothing registered a communicator.
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = 0, who.world_size = 4, who.local_rank = 0, who.local_size = 4;
  discard_sink s;
  try {
    (void)load_distributed(location(checkpoint_dir().string()), "tp1,dp4,ep4", "none", who, s);
    FAIL("a 4-rank load ran without a communicator");
  } catch (const missing_component_error& e) {
    CHECK(e.component() == "sluice::gloo");
    CHECK_THAT(e.what(), Catch::Contains("link sluice::gloo"));
  }
}

TEST_CASE("with a device lane, the driver's thread takes the lane's buffers and the exchange thread uploads and exchanges",
          "[distributed][pipeline][lane]") {
  const auto ref = reference_digests();
  for (const bool overlap : {true, false}) {
    INFO((overlap ? "overlapped" : "serial"));
    const auto ck = checkpoint::open(checkpoint_dir());
    const auto opt = many_windows(overlap);
    const auto plan = plan_for(ck, "tp1,dp1,ep1", "per-rank", opt);
    REQUIRE(plan.windows >= 4);
    comm::local c;
    thread_recording_lane lane(c);
    device_digest_sink s;
    const auto st = load_distributed(ck, c, plan, s, opt, lane);
    REQUIRE(st.overlapped == overlap);
    REQUIRE(s.device > 0);
    REQUIRE(lane.inner.uploads() > 0);
    std::map<std::string, std::string> got;
    for (auto& [n, d] : s.digests.digests()) got[n] = d.sha256;
    REQUIRE(got == ref);
    const auto driver = std::this_thread::get_id();
    REQUIRE(lane.threads["host_buffer"] == std::set{driver});
    REQUIRE(lane.threads["device_buffer"] == std::set{driver});
    REQUIRE(lane.threads["upload"].size() == 1);
    REQUIRE(lane.threads["exchange"] == lane.threads["upload"]);  // one stage, one thread
    REQUIRE(lane.threads["exchange"].contains(driver) == !overlap);
  }
}

// plan_options_for: a node whose ranks take what they keep from its page
// cache cuts windows of window_bytes / local ranks (the node's window buffers
// together one process's); anything that carries messages keeps its windows.
TEST_CASE("one node reading through its page cache cuts smaller windows, anything with messages keeps them",
          "[distributed][pipeline]") {
  const auto ck = checkpoint::open(checkpoint_dir());
  distributed_options o;
  const auto asked = o.plan.window_bytes;
  REQUIRE(plan_options_for(ck, 8, o).window_bytes == asked / 8);  // local_size 0: the world is one node
  o.plan.local_size = 4;
  REQUIRE(plan_options_for(ck, 4, o).window_bytes == asked / 4);
  REQUIRE(plan_options_for(ck, 8, o).window_bytes == asked);  // two nodes: messages between them
  REQUIRE(plan_options_for(ck, 1, distributed_options{}).window_bytes == asked);  // one rank
  o.plan.local_size = 64;
  REQUIRE(plan_options_for(ck, 64, o).window_bytes == std::uint64_t{16} << 20);  // at least 16 MiB
  o.plan.window_bytes = 1u << 20;
  REQUIRE(plan_options_for(ck, 64, o).window_bytes == 1u << 20);  // never more than asked
  o.plan.window_bytes = asked, o.plan.local_size = 4;
  auto off = o;
  off.page_cache = false;  // over the node window: its copies wait on every reader
  REQUIRE(plan_options_for(ck, 4, off).window_bytes == asked);
  off = o;
  off.load.io = io_mode::direct;  // O_DIRECT reads do not share the page cache
  REQUIRE(plan_options_for(ck, 4, off).window_bytes == asked);
}

// Every window here carries no message (one rank): with status_every 0 each
// window's status exchange reports its failure; by default the next status
// exchange (here the last window's) does, naming the windows it covers, and
// nothing after the failed window is read or delivered meanwhile.
TEST_CASE("a read that fails on one window fails the load at the next status exchange, naming the file and the windows",
          "[distributed][pipeline]") {
  for (const bool overlap : {false, true})
    for (const std::uint64_t every : {std::uint64_t{0}, policy::default_status_every}) {
      INFO((overlap ? "overlapped" : "serial") << ", status_every " << every);
      const auto ck = checkpoint::open(checkpoint_dir());
      auto opt = many_windows(overlap);
      opt.status_every = every;
      const auto plan = plan_for(ck, "tp1,dp1,ep1", "per-rank", opt);
      REQUIRE(plan.windows >= 4);
      event_log log;
      logging_comm c{{}, &log};
      logging_sink s{{}, &log, {}};
      for (const auto& e : plan.entries) s.window_of[e.info.name] = e.window;
      // The third window's first read fails.
      struct failing_source {
        std::unique_ptr<any_source> inner;
        const policy::load_plan* plan;
        const checkpoint* ck;
        event_log* log;
        [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
          for (const auto& e : plan->entries) {
            const auto& t = ck->tensors()[e.index];
            if (t.shard != file || offset < t.offset || offset >= t.offset + t.size) continue;
            log->add("read", e.window);
            if (e.window == 2)
              throw io_error("injected read failure", {inner->file_uri(file), t.name, byte_range{offset, offset + dst.size()}});
          }
          return inner->read_at(file, offset, dst);
        }
        [[nodiscard]] std::size_t file_count() const { return inner->file_count(); }
        [[nodiscard]] std::string file_uri(std::uint32_t file) const { return inner->file_uri(file); }
        [[nodiscard]] const io_counters& counters() const noexcept { return inner->counters(); }
      };
      try {
        (void)load_distributed_with(ck, c, plan, s, opt, [&](asio::io_context& ioc) {
          return std::make_unique<failing_source>(
              failing_source{ck.storage().open_source(ck, ioc, opt.load.source()), &plan, &ck, &log});
        });
        FAIL("no error");
      } catch (const distributed_error& e) {
        const auto where = every == 0 ? std::string("rank 0 failed while reading window 3 of")
                                      : fmt::format("rank 0 failed while reading windows 1-{} of {}", plan.windows, plan.windows);
        REQUIRE_THAT(e.what(), Catch::Contains(where) && Catch::Contains("injected read failure") &&
                                   Catch::Contains(".safetensors"));
      }
      // Windows 0 and 1 were delivered (and exchanged, where windows
      // exchange), window 2 failed, and nothing after it was read,
      // exchanged or delivered.
      for (std::uint32_t w = 0; w < 2; ++w) REQUIRE(log.first("deliver", w) >= 0);
      if (every == 0) REQUIRE(log.first("exchange", 1) >= 0);
      REQUIRE(log.first("read", 2) >= 0);
      // (By default no window exchanged: the last, which would, reports the failure first.)
      REQUIRE(log.first("exchange", every == 0 ? 2 : 0) < 0);
      for (std::uint32_t w = 2; w < plan.windows; ++w) REQUIRE(log.first("deliver", w) < 0);
      for (std::uint32_t w = 3; w < plan.windows; ++w) REQUIRE(log.first("read", w) < 0);
    }
}

namespace {
std::map<std::string, std::string> sha256s(const digest_sink& d) {
  std::map<std::string, std::string> m;
  for (const auto& [n, t] : d.digests()) m[n] = t.sha256;
  return m;
}
}  // namespace

TEST_CASE("a static topology and an offload type reach the plan and the driver with no run-time parse",
          "[distributed][typed]") {
  using topo = policy::topology<1, 1, 1>;
  using off = policy::offload::per_rank_host;
  const auto ck = checkpoint::open(checkpoint_dir());
  const auto opt = many_windows(false);
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = 0, who.world_size = 1, who.local_rank = 0, who.local_size = 1;

  const auto before = policy::run_time_parses();
  const auto plan = plan_for(ck, topo{}, off{}, opt);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(plan)>, policy::plan<topo, off>>);
  STATIC_REQUIRE(std::remove_cvref_t<decltype(plan)>::static_world == 1);
  STATIC_REQUIRE(std::remove_cvref_t<decltype(plan)>::static_offload == policy::offload_kind::per_rank_host);
  comm::local c;
  digest_sink typed, tool, opened;
  (void)load_distributed(ck, c, plan, typed, opt);
  (void)load_distributed(ck, topo{}, off{}, who, tool, opt);
  (void)load_distributed(location(checkpoint_dir().string()), topo{}, off{}, who, opened, opt);
  // The check: routing any of the three through topology or offload text
  // (topology_spec(topo.to_string()), parse_offload(...)) parses it here.
  REQUIRE(policy::run_time_parses() == before);

  // The same load from run-time text: each string parsed once, where the
  // API reads it (so the hook above does see a parse when there is one).
  const std::string topology_text = "tp1,dp1,ep1", offload_text = "per-rank";
  const auto parsed = plan_for(ck, topology_text, offload_text, opt);
  REQUIRE(policy::run_time_parses() == before + 2);
  digest_sink from_text;
  (void)load_distributed(ck, c, parsed, from_text, opt);

  // One plan and one load, whichever way in.
  REQUIRE(plan.read_bytes == parsed.read_bytes);
  REQUIRE(plan.windows == parsed.windows);
  REQUIRE(policy::make_schedule(plan).digest == policy::make_schedule(parsed).digest);
  const auto ref = reference_digests();
  REQUIRE(sha256s(typed) == ref);
  REQUIRE(sha256s(tool) == ref);
  REQUIRE(sha256s(opened) == ref);
  REQUIRE(sha256s(from_text) == ref);
}

TEST_CASE("a static topology whose world is not the communicator's fails before any collective, naming both",
          "[distributed][typed]") {
  const auto ck = checkpoint::open(checkpoint_dir());
  const auto plan = plan_for(ck, policy::topology<1, 2, 2>{}, policy::offload::none{});
  event_log log;
  logging_comm c{{}, &log};  // a world of one whose type does not say so (comm::local's does: that does not compile)
  discard_sink s;
  REQUIRE_THROWS_WITH(load_distributed(ck, c, plan, s),
                      Catch::Contains("static topology tp1,dp2,ep2 has 2 ranks, the communicator 1"));
  REQUIRE(log.events.empty());
  // The tool-level call checks WORLD_SIZE before joining a world (this
  // executable links no communicator: joining would name sluice::gloo).
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = 0, who.world_size = 4, who.local_rank = 0, who.local_size = 4;
  REQUIRE_THROWS_WITH(load_distributed(ck, policy::topology<1, 2, 2>{}, policy::offload::none{}, who, s),
                      Catch::Contains("topology tp1,dp2,ep2 has 2 ranks but WORLD_SIZE is 4"));
}
