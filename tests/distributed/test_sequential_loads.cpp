// Two loads in sequence on one Gloo communicator (a main model, then its
// draft through checkpoint selection), 4 forked ranks: in every rank, the
// open file descriptors and threads (io_uring's kernel workers aside) after
// each load equal those before the first, and neither load's shared segment
// is left: no descriptor, mapping or /dev/shm entry of it. Only what the
// test's own processes made is counted (sluice_test::footprint): the loads'
// segments are told apart by a name no other process uses
// (distributed_options::segment_name), since other processes on a busy
// machine create and remove shared memory, sluice's tests included.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <sluice/gloo/communicator.hpp>
#include <sluice/distributed.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/testing/generator.hpp>

#include "../comm/multiprocess.hpp"
#include "../support/footprint.hpp"

using namespace sluice;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

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
  const auto segment = fmt::format("sluice-seq-{}", ::getpid());  // this test's loads' segments, and no one else's
  constexpr std::size_t n = 4;
  const auto res = sluice_test::run_ranks(
      n,
      [&](std::size_t rank) {
        std::ofstream log(out / fmt::format("rank{}.txt", rank));
        comm::rank_info who;
        who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n;
        who.store_dir = store.string();
        who.timeout = 120s;  // bounds a hang only: a busy machine may be slow to start four ranks
        comm::gloo c(who);
        c.barrier();
        const auto before_first = sluice_test::footprint::now(segment);
        distributed_options opt;
        opt.load.staging_budget = 8u << 20;
        opt.load.max_read = 1u << 20;
        opt.load.register_buffers = false;
        opt.plan.window_bytes = 96u << 10;
        opt.plan.local_size = n;
        opt.segment_name = segment;
        // Nothing of the loads' is left: the counts are those before, and none is a segment's.
        auto clean = [&](const sluice_test::footprint& f) {
          return f.same_counts(before_first) && f.segment_fds == 0 && f.segment_maps == 0 && f.shm_entries == 0;
        };
        log << "before: " << before_first.str() << "\n";
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
        const auto mid = sluice_test::footprint::now(segment);
        log << "after main: " << mid.str() << "\n";
        if (!clean(mid)) code = code ? code : 11;
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
        const auto after = sluice_test::footprint::now(segment);
        log << "after draft: " << after.str() << "\n";
        if (!clean(after)) code = code ? code : 13;
        // No rank closes the world (its watch's connections: descriptors of
        // every peer's count) before every rank has counted.
        c.barrier();
        return code;
      },
      300s);
  for (std::size_t r = 0; r < n; ++r) {
    std::ifstream f(out / fmt::format("rank{}.txt", r));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    INFO("rank " << r << " (10: nothing loaded, 11: leak after main, 12: bad draft, 13: leak after draft)\n" << text);
    CHECK(res[r].code == 0);
    CHECK_FALSE(res[r].timed_out);
  }
  std::string keys;
  const auto left = sluice_test::store_keys(store, &keys);
  INFO("rendezvous keys left: " << keys);
  CHECK(left == 0);  // the communicator removed its keys once every rank met
  fs::remove_all(store);
  fs::remove_all(out);
  fs::remove_all(ckdir);
}
