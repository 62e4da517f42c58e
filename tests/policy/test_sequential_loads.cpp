// Two loads in sequence on one Gloo communicator (a main model, then its
// draft through checkpoint selection), 4 forked ranks: every rank's open
// file descriptors and threads (io_uring's kernel workers aside) after each
// load equal those before the first, no shared segment stays mapped, and no
// /dev/shm entry of sluice's is left behind. Only what the test's own
// processes made is counted: other processes on a busy machine may create and
// remove shared memory meanwhile.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <sluice/gloo/communicator.hpp>
#include <sluice/distributed.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/testing/generator.hpp>

#include "../comm/multiprocess.hpp"

using namespace sluice;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {
std::size_t entries(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
  return n;
}
// The process's own threads. io_uring's io-wq workers (`iou-wrk-*`) are
// kernel threads listed under /proc/self/task; they go away by themselves
// (idle timeout, or after the ring is torn down, asynchronously), so they are
// not counted: a ring left open shows in the descriptor count instead.
std::size_t own_threads() {
  std::size_t n = 0;
  for (const auto& t : fs::directory_iterator("/proc/self/task")) {
    std::ifstream f(t.path() / "comm");
    std::string name;
    std::getline(f, name);
    if (!name.starts_with("iou-wrk-") && !name.starts_with("iou-sqp-")) ++n;
  }
  return n;
}
// Entries of `dir` whose name starts with "sluice" (what this library could
// have made there).
std::size_t sluice_entries(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    n += it->path().filename().string().starts_with("sluice") ? 1 : 0;
  return n;
}
// Mappings of a shared segment (a memfd named sluice-shared-*) in this process.
std::size_t segment_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/memfd:sluice-shared") != std::string::npos ? 1 : 0;
  return n;
}
struct usage {
  std::size_t fds = 0, threads = 0, segments = 0;
  static usage now() { return {entries("/proc/self/fd"), own_threads(), segment_mappings()}; }
  friend bool operator==(const usage&, const usage&) = default;
};
// The threads' names, for the log.
std::string thread_names() {
  std::string s;
  for (const auto& t : fs::directory_iterator("/proc/self/task")) {
    std::ifstream f(t.path() / "comm");
    std::string name;
    std::getline(f, name);
    s += name + " ";
  }
  return s;
}
}  // namespace

TEST_CASE("a main model then its draft on one Gloo communicator leak no thread, socket or segment",
          "[policy][distributed][lifetimes]") {
  testing::generator_options o;
  o.experts = 8;
  o.layers = 3;
  o.engram_rows = 4096;
  o.max_shard_bytes = 128u << 10;
  const auto ckdir = sluice_test::fresh_dir("seq-ckpt");
  testing::write_checkpoint(ckdir, o);
  const auto draft_prefix = fmt::format("model.layers.{}.", o.layers);  // the generator's draft (MTP) layer
  const auto store = sluice_test::fresh_dir("seq-store");
  const auto out = sluice_test::fresh_dir("seq-out");
  const auto shm_before = sluice_entries("/dev/shm");
  constexpr std::size_t n = 4;
  const auto res = sluice_test::run_ranks(
      n,
      [&](std::size_t rank) {
        std::ofstream log(out / fmt::format("rank{}.txt", rank));
        comm::rank_info who;
        who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n;
        who.store_dir = store.string();
        who.timeout = 20s;
        comm::gloo c(who);
        c.barrier();
        distributed_options opt;
        opt.load.staging_budget = 8u << 20;
        opt.load.max_read = 1u << 20;
        opt.load.register_buffers = false;
        opt.plan.window_bytes = 96u << 10;
        opt.plan.local_size = n;
        const auto before = usage::now();
        log << "before fds " << before.fds << " threads " << before.threads << " segments " << before.segments << " (" << thread_names() << ")\n";
        auto main_ck = checkpoint::open(ckdir);
        int code = 0;
        {
          digest_sink s;
          const auto plan = plan_for(main_ck, "tp1,dp4,ep4", "shared-cooperative", opt);
          const auto st = load_distributed(main_ck, c, plan, s, opt);
          log << "main: " << s.digests().size() << " tensors, " << st.bytes_read << " bytes read\n";
          if (s.digests().empty()) code = 10;
        }
        c.barrier();
        const auto mid = usage::now();
        log << "after main fds " << mid.fds << " threads " << mid.threads << " segments " << mid.segments << " (" << thread_names() << ")\n";
        if (!(mid == before)) code = code ? code : 11;
        {
          const auto draft = main_ck.select([&](const tensor_ref& t) { return t.name.starts_with(draft_prefix); });
          digest_sink s;
          const auto plan = plan_for(draft, "tp1,dp4,ep4", "shared-cooperative", opt);
          const auto st = load_distributed(draft, c, plan, s, opt);
          log << "draft: " << draft.tensors().size() << " tensors in the selection, " << s.digests().size()
              << " held, " << st.bytes_read << " bytes read\n";
          if (s.digests().empty() || draft.tensors().size() >= main_ck.tensors().size()) code = code ? code : 12;
        }
        c.barrier();
        const auto after = usage::now();
        log << "after draft fds " << after.fds << " threads " << after.threads << " segments " << after.segments << " (" << thread_names() << ")\n";
        if (!(after == before)) code = code ? code : 13;
        return code;
      },
      120s);
  for (std::size_t r = 0; r < n; ++r) {
    std::ifstream f(out / fmt::format("rank{}.txt", r));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    INFO("rank " << r << " (10: nothing loaded, 11: leak after main, 12: bad draft, 13: leak after draft)\n" << text);
    CHECK(res[r].code == 0);
    CHECK_FALSE(res[r].timed_out);
  }
  CHECK(sluice_entries("/dev/shm") == shm_before);
  fs::remove_all(store);
  fs::remove_all(out);
  fs::remove_all(ckdir);
}
