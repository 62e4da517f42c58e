#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include <sluice/gloo/communicator.hpp>
#include <sluice/distributed.hpp>
#include <sluice/format/writer.hpp>
#include <sluice/memory/page_reporting.hpp>
#include <sluice/sink/callback_sink.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/source/page_cache.hpp>
#include <sluice/testing/emulated_device_lane.hpp>
#include <sluice/testing/generator.hpp>

#include "multiprocess.hpp"
#include "support/files.hpp"
#include "rank_json.hpp"
#include "recording_sink.hpp"

using namespace sluice;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using sluice_test::recording_sink;

testing::generator_options small_model() {
  testing::generator_options o;
  o.experts = 8;
  o.layers = 3;
  o.engram_rows = 4096;  // 2 tables of 512 KiB + scales
  o.max_shard_bytes = 128u << 10;
  return o;
}

const fs::path& checkpoint_dir() {
  static const fs::path dir = [] {
    auto d = sluice_test::process_dir("dist-ckpt");
    testing::write_checkpoint(d, small_model());
    return d;
  }();
  return dir;
}

// Written at the test process's start, before any rank forks: the ranks share
// it, and the test process removes it at exit (a rank that wrote its own
// would leave it behind, ranks end in _exit).
[[maybe_unused]] const fs::path& shared_checkpoint = checkpoint_dir();

distributed_options small_options() {
  distributed_options o;
  o.load.staging_budget = 8u << 20;
  o.load.max_read = 1u << 20;
  o.load.register_buffers = false;
  o.plan.window_bytes = 96u << 10;  // many windows
  o.plan.split_bytes = 64u << 10;   // and tensors read in slices
  return o;
}

// Rank `rank` of `n` ranks on one node (this machine), meeting through `store`.
comm::rank_info one_node(std::size_t rank, std::size_t n, const fs::path& store) {
  comm::rank_info who;
  who.hostname = "127.0.0.1";
  who.rank = rank, who.world_size = n, who.local_rank = rank, who.local_size = n;
  who.store_dir = store.string();
  who.timeout = 20s;
  return who;
}

// Runs body(rank, who) on `n` ranks of one node that meet through a fresh
// store (`tag` names its folder); their exit codes.
std::vector<sluice_test::rank_result> on_one_node(std::size_t n, const char* tag,
                                                  const std::function<int(std::size_t, const comm::rank_info&)>& body) {
  const auto store = sluice_test::fresh_dir(tag);
  auto res = sluice_test::run_ranks(n, [&](std::size_t rank) { return body(rank, one_node(rank, n, store)); }, 120s);
  fs::remove_all(store);
  return res;
}

std::map<std::string, std::string> reference_digests(const fs::path& dir = checkpoint_dir()) {
  auto ck = checkpoint::open(dir);
  digest_sink d;
  load_options lo;
  lo.register_buffers = false;
  lo.staging_budget = 8u << 20;
  lo.max_read = 1u << 20;
  (void)load(ck, d, lo);
  std::map<std::string, std::string> m;
  for (auto& [n, t] : d.digests()) m[n] = t.sha256;
  return m;
}

// The digest of the part of `e` that rank `r` keeps under `plan` (the whole
// tensor's when it is not split), cut from the single-process load's bytes.
std::string expected_digest(const policy::load_plan& plan, const policy::plan_entry& e, policy::rank_t r,
                            const checkpoint& ck, const std::map<std::string, std::string>& whole) {
  if (e.split == policy::tp_split::none) return whole.at(e.info.name);
  static std::map<std::string, std::vector<std::byte>> bytes = [] {
    auto c = checkpoint::open(checkpoint_dir());
    std::map<std::string, std::vector<std::byte>> m;
    auto keep = [&m](tensor_view v) {
      auto& b = m[v.name()];
      b.resize(v.tensor_size());
      if (!v.bytes.empty()) std::memcpy(b.data() + v.offset, v.bytes.data(), v.bytes.size());
      return true;
    };
    callback_sink cs(keep);
    load_options lo;
    lo.register_buffers = false;
    (void)load(c, cs, lo);
    return m;
  }();
  const auto& all = bytes.at(e.info.name);
  const auto n = plan.kept_bytes(e), k = plan.part_of(e, r);
  std::vector<std::byte> part(n);
  std::uint32_t dim = e.split == policy::tp_split::rows ? 0u : 1u, groups = 1;
  if (!e.run_ends.empty()) {
    // Unequal runs of dim 0: block k of each, packed.
    dim = 0, groups = e.groups;
    std::uint64_t at = 0, begin = 0;
    for (const auto end : e.run_ends) {
      const auto block = (end - begin) / plan.parts(e);
      std::memcpy(part.data() + at, all.data() + begin + k * block, block);
      at += block, begin = end;
    }
    REQUIRE(at == n);
  } else if (e.groups) {
    // Block k of each of the runs of dimension group_dim, packed in order
    // (from the shape, not from the plan's column rows).
    dim = e.group_dim, groups = e.groups;
    const std::uint64_t outer = dim == 0 ? 1 : e.info.shape[0], run = e.info.size / outer / groups,
                        block = run / plan.parts(e);
    std::uint64_t at = 0;
    for (std::uint64_t o = 0; o < outer; ++o)
      for (std::uint64_t g = 0; g < groups; ++g, at += block)
        std::memcpy(part.data() + at, all.data() + (o * groups + g) * run + k * block, block);
    REQUIRE(at == n);
  } else if (e.split == policy::tp_split::rows) {
    std::memcpy(part.data(), all.data() + plan.kept_begin(e, r), n);
  } else {
    const auto row = policy::load_plan::row_bytes(e), w = row / plan.parts(e);
    for (std::uint64_t j = 0; j < e.info.shape[0]; ++j) std::memcpy(part.data() + j * w, all.data() + j * row + k * w, w);
  }
  digest_sink d;
  tensor_view v;
  v.tensor = &ck.tensors()[e.index];
  v.bytes = part;
  v.part = {dim, static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(plan.parts(e)), groups};
  d.accept(std::move(v));
  return d.digests().at(e.info.name).sha256;
}

// How a test's ranks load: through the tool-level call, or through a Gloo
// communicator with an emulated device lane (device tensors travel in lane
// memory; the sink gets device views), optionally into a plain digest_sink,
// which must refuse them.
enum class lane_mode { none, emulated, emulated_host_sink };

// Runs `n` ranks; each writes its result (or error) to out/rank<r>.json.
// `nodes`: the ranks as that many simulated nodes of n / nodes ranks each
// (ranks of one node share its page cache and shared segment; between
// nodes every byte travels over Gloo).
std::vector<nlohmann::json> run_load(std::size_t n, std::string topology, std::string offload, const distributed_options& dopt,
                                     const std::function<void(std::size_t, fs::path&)>& before = {},
                                     const std::function<void(std::size_t, const fs::path&)>& after_open = {},
                                     lane_mode mode = lane_mode::none, std::size_t nodes = 1) {
  const std::size_t local = n / nodes;
  const auto store = sluice_test::fresh_dir("dist-store");
  const auto out = sluice_test::fresh_dir("dist-out");
  const auto& ckdir = checkpoint_dir();
  auto res = sluice_test::run_ranks(
      n,
      [&](std::size_t rank) {
        nlohmann::json j;
        int code = 0;
        try {
          comm::rank_info who;
          who.hostname = "127.0.0.1";  // every "node" of the test is this machine
          who.rank = rank, who.world_size = n, who.local_rank = rank % local, who.local_size = local;
          who.store_dir = store.string();
          who.timeout = 20s;
          fs::path dir = ckdir;
          if (before) before(rank, dir);
          auto ck = checkpoint::open(dir);
          if (after_open) after_open(rank, dir);
          recording_sink s;
          distributed_stats st;
          if (mode == lane_mode::none) {
            st = load_distributed(ck, topology, offload, who, s, dopt);
          } else {
            comm::gloo c(who);
            auto o = dopt;
            o.plan.local_size = local;
            const auto plan = plan_for(ck, topology, offload, o);
            testing::emulated_device_lane lane(c);
            if (mode == lane_mode::emulated_host_sink) {
              digest_sink plain;  // host-only: the lane's views reach it only through an any_sink
              any_sink erased(plain);
              st = load_distributed(ck, c, plan, erased, o, lane);
            } else {
              st = load_distributed(ck, c, plan, s, o, lane);
            }
            j["lane"] = {{"uploaded_bytes", lane.uploaded_bytes()}, {"exchanges", lane.exchanges()},
                         {"unpinned_upload_bytes", lane.unpinned_upload_bytes()}, {"pins", lane.pins()}};
          }
          j["stats"] = st.to_json();
          for (auto& [name, d] : s.digests.digests()) j["digests"][name] = d.sha256;
          j["calls"] = s.calls;
          j["device"] = s.device;
          j["host"] = s.host;
        } catch (const std::exception& e) {
          j["error"] = e.what();
          code = 3;
        }
        sluice_test::write_rank_json(out, rank, j);
        return code;
      },
      120s);
  auto results = sluice_test::read_rank_jsons(out, res);
  fs::remove_all(store);
  fs::remove_all(out);
  return results;
}

// Loads as one node and, with an even number of ranks, as two: within a
// node a rank reads what it keeps from the page cache (nothing crosses
// Gloo), between nodes it arrives over Gloo, exactly what the schedule says.
void check_load_on(std::size_t nodes, std::size_t n, const std::string& topology, const std::string& offload,
                   const distributed_options& dopt, lane_mode mode) {
  INFO(topology << " " << offload << " on " << nodes << " node(s)");
  const auto ref = reference_digests();
  auto ck = checkpoint::open(checkpoint_dir());
  auto opt = small_options();
  opt.plan.local_size = n / nodes;
  opt.plan.split_bytes = dopt.plan.split_bytes;
  opt.plan.experts = dopt.plan.experts;
  opt.plan.model_owners = dopt.plan.model_owners;
  const auto plan = plan_for(ck, topology, offload, opt);
  // What travels over the communicator and what each rank takes from the
  // page cache, as the driver schedules it (local files, buffered).
  // How the driver carries a node's messages (local files: the page cache,
  // unless turned off; then the node window, unless turned off too).
  const auto carrier = n / nodes == 1 ? policy::node_copy::none
                       : dopt.page_cache ? policy::node_copy::page_cache
                       : dopt.node_window ? policy::node_copy::window : policy::node_copy::none;
  const bool by_node = carrier != policy::node_copy::none;
  const bool relay = dopt.node_window && n / nodes > 1 && nodes > 1;
  const auto sched = policy::make_schedule(plan, mode == lane_mode::none ? policy::lane_split::one : policy::lane_split::host_and_device,
                                           carrier, relay, dopt.status_every);
  std::uint64_t status_windows = 0;  // window_schedule::status: the failure protocol's exchanges
  for (const auto& w : sched.windows) status_windows += w.status;
  std::vector<std::uint64_t> gloo_in(n, 0), gloo_out(n, 0), taken(n, 0), copied(n, 0);
  for (const auto& w : sched.windows)
    for (const auto& L : w.lanes) {
      for (std::size_t r = 0; r < n; ++r)
        for (const auto& c : L.ranks[r].copies) copied[r] += c.size;
      for (const auto& m : L.messages) gloo_in[m.to] += m.size, gloo_out[m.from] += m.size;
      for (const auto& m : L.second) gloo_in[m.to] += m.size, gloo_out[m.from] += m.size;  // the device lane's relays
      for (std::size_t r = 0; r < n; ++r)
        for (const auto& x : L.ranks[r].reads)
          if (x.taken) taken[r] += plan.entries[x.entry].reads[x.read].size;
    }
  std::uint64_t all_taken = 0, all_in = 0;
  for (std::size_t r = 0; r < n; ++r) all_taken += taken[r], all_in += gloo_in[r];
  if (nodes == 1 && by_node) REQUIRE(all_in == 0);  // nothing crosses a socket within a node
  if (n > 1 && nodes == 1 && by_node) REQUIRE(all_taken > 0);
  if (!by_node) REQUIRE(all_taken == 0);  // one rank per node, or asked: every byte travels
  const auto results = run_load(n, topology, offload, dopt, {}, {}, mode, nodes);
  std::uint64_t read = 0, written = 0, shared_table_bytes = 0, device_table_bytes = 0, uploaded = 0, mapped = 0, delivered = 0;
  for (const auto& e : plan.entries) {
    if (e.shared()) shared_table_bytes += e.info.size;
    if (e.owner_destination == policy::destination::device) device_table_bytes += e.info.size;
  }
  for (std::size_t r = 0; r < n; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 2000));
    REQUIRE(j["exit"] == 0);
    // Exactly the tensors it owns (shared tables included), equal to the single-process load.
    std::set<std::string> owned, got;
    for (const auto& e : plan.entries)
      if (e.owners.contains(static_cast<policy::rank_t>(r))) owned.insert(e.info.name);
    for (auto& [name, sha] : j["digests"].items()) {
      INFO(name);
      got.insert(name);
      REQUIRE(sha.get<std::string>() == expected_digest(plan, plan.entry(name), static_cast<policy::rank_t>(r), ck, ref));
    }
    REQUIRE(got == owned);
    // It received exactly what it keeps but did not read (its parts, not
    // whole tensors) from ranks of other nodes, and took the rest from its
    // node's page cache.
    REQUIRE(j["stats"]["bytes_received"].get<std::uint64_t>() == gloo_in[r]);
    REQUIRE(j["stats"]["status_exchanges"].get<std::uint64_t>() == status_windows);
    REQUIRE(j["stats"]["overlapped"].get<bool>() == dopt.overlaps(n / nodes));
    REQUIRE(j["stats"]["bytes_sent"].get<std::uint64_t>() == gloo_out[r]);
    std::uint64_t table_take = 0;  // tables as views: what its node's other ranks were to read
    if (dopt.load.map_above && carrier == policy::node_copy::page_cache)
      for (const auto& e : plan.entries)
        if (e.shared())
          for (const auto& rd : e.reads)
            if (rd.reader != r && plan.node_of(rd.reader) == plan.node_of(static_cast<policy::rank_t>(r))) table_take += rd.size;
    const bool windowed = carrier == policy::node_copy::window;
    REQUIRE(j["stats"]["page_cache_bytes"].get<std::uint64_t>() == (windowed ? 0 : taken[r] + table_take));
    // Table views: its share of the tables' reads it skipped, the page cache
    // holding them (it read the rest); the source read exactly the others.
    std::uint64_t table_share = 0;
    for (const auto& e : plan.entries)
      if (e.shared())
        for (const auto& rd : e.reads)
          if (rd.reader == r) table_share += rd.size;
    // Or, into the segment: its share the page cache held, written from it
    // (the rest read into the segment's mapping).
    const auto resident = j["stats"]["resident_bytes"].get<std::uint64_t>();
    REQUIRE(resident <= table_share);
    if (carrier == policy::node_copy::page_cache)
      REQUIRE(j["stats"]["storage_bytes"].get<std::uint64_t>() + resident == j["stats"]["bytes_read"].get<std::uint64_t>());
    REQUIRE(j["stats"]["node_copied_bytes"].get<std::uint64_t>() == (windowed ? taken[r] : 0) + copied[r]);
    REQUIRE((j["stats"]["node_window_bytes"].get<std::uint64_t>() > 0) == (sched.node_window_bytes > 0));
    if (!by_node && !relay) REQUIRE(gloo_in[r] == plan.received_bytes[r]);
    // Every rank's sink saw the same sequence of calls.
    std::vector<std::string> names, names0;
    for (auto& c : j["calls"]) names.push_back(c.get<std::string>());
    for (auto& c : results[0]["calls"]) names0.push_back(c.get<std::string>());
    REQUIRE(names == names0);
    REQUIRE(names.size() == ck.tensors().size());
    // With a device lane, exactly its tensors destined for the device come as
    // device views, in lane memory the rank uploaded to or received into.
    std::set<std::string> device, want_device;
    for (auto& d : j["device"]) device.insert(d.get<std::string>());
    if (mode == lane_mode::emulated) {
      for (const auto& e : plan.entries)
        if (e.owners.contains(static_cast<policy::rank_t>(r)) && e.owner_destination == policy::destination::device)
          want_device.insert(e.info.name);
      REQUIRE_FALSE(want_device.empty());
      REQUIRE(j["stats"]["device_views"].get<std::size_t>() == want_device.size());
      // One exchange per window, and a second where the device lane's relays send on.
      std::uint32_t second_steps = 0;
      for (const auto& w : sched.windows) second_steps += !w.lanes.at(1).second.empty();
      REQUIRE(j["lane"]["exchanges"].get<std::uint32_t>() == plan.windows + second_steps);
      // Across nodes, device bytes two ranks of a node keep cross once, to the node's relay.
      if (relay && plan.tp == 1) REQUIRE(second_steps > 0);
      REQUIRE(j["lane"]["uploaded_bytes"] == j["stats"]["bytes_uploaded"]);
      REQUIRE(j["stats"]["bytes_uploaded"].get<std::uint64_t>() > 0);
      // Every upload reads pinned memory: the lane's host buffers, or the
      // node window, pinned once for the load (and only where there is one).
      REQUIRE(j["lane"]["unpinned_upload_bytes"] == 0);
      REQUIRE(j["lane"]["pins"] == (j["stats"]["node_window_bytes"].get<std::uint64_t>() > 0 ? 1 : 0));
    }
    REQUIRE(device == want_device);
    // Offloaded tables (per-rank host memory, the shared segment) come as
    // views whose home is host memory, and only they: a device sink leaves
    // exactly these on the host.
    std::set<std::string> host, want_host;
    for (auto& h : j["host"]) host.insert(h.get<std::string>());
    for (const auto& e : plan.entries)
      if (e.owners.contains(static_cast<policy::rank_t>(r)) && e.owner_destination != policy::destination::device)
        want_host.insert(e.info.name);
    REQUIRE(host == want_host);
    if (mode == lane_mode::emulated) uploaded += j["stats"]["bytes_uploaded"].get<std::uint64_t>();
    mapped += j["stats"]["mapped_bytes"].get<std::uint64_t>();
    if (!dopt.load.map_above) REQUIRE(j["stats"]["mapped_bytes"] == 0);
    delivered += j["stats"]["delivered_read_bytes"].get<std::uint64_t>();
    if (!dopt.pieces_above) REQUIRE(j["stats"]["delivered_read_bytes"] == 0);
    read += j["stats"]["bytes_read"].get<std::uint64_t>();
    written += j["stats"]["shared_bytes_written"].get<std::uint64_t>();
  }
  REQUIRE(read == ck.tensor_bytes() + shared_table_bytes * (nodes - 1));  // each byte read from storage once (tables: once per node)
  // Lane memory holds tensors for the device only: no offloaded table is ever
  // uploaded. Without column splits each device byte goes up once on one node
  // per rank that reads or takes it, and that is the device bytes each keeps.
  if (mode == lane_mode::emulated && plan.tp == 1) {
    std::uint64_t up = 0;
    for (const auto& w : sched.windows)
      for (const auto& r : w.lanes.at(1).ranks)
        for (const auto& x : r.reads) up += plan.entries[x.entry].reads[x.read].size;
    REQUIRE(uploaded == up);
    if (nodes == 1) {
      std::uint64_t kept = 0;
      for (const auto& e : plan.entries)
        if (e.owner_destination == policy::destination::device) kept += e.info.size * e.owners.size();
      REQUIRE(uploaded == kept);
    }
    REQUIRE(uploaded >= device_table_bytes);
  }
  // Each node's shared segment written once; or, with views of the page
  // cache asked for on a node that shares it, no segment: every local rank
  // maps the tables' file ranges.
  // A rank alone on its node maps its tables all the same.
  const bool table_views =
      dopt.load.map_above && (carrier == policy::node_copy::page_cache || (n / nodes == 1 && dopt.page_cache));
  REQUIRE(written == (table_views ? 0 : shared_table_bytes * nodes));
  if (table_views)
    for (const auto& j : results) REQUIRE(j["stats"]["shared_bytes"] == 0);
  // Views of the page cache where asked for: what a rank keeps in host memory
  // whole or as a row part, and neither sends nor receives.
  if (dopt.load.map_above && mode == lane_mode::none) REQUIRE(mapped > 0);
  // Read at delivery where asked for every size: what a rank keeps and
  // neither sends nor receives (on one node through its page cache: every
  // host tensor; across nodes, what a node's ranks read alone).
  if (dopt.pieces_above == 1 && !dopt.load.map_above && nodes == 1 && carrier == policy::node_copy::page_cache)
    REQUIRE(delivered > 0);
}

void check_load(std::size_t n, const std::string& topology, const std::string& offload,
                const distributed_options& dopt = small_options(), lane_mode mode = lane_mode::none) {
  check_load_on(1, n, topology, offload, dopt, mode);
  if (n % 2 == 0) check_load_on(2, n, topology, offload, dopt, mode);
}

// Every shard of `ck` read into the page cache (`keep`) or dropped from it.
void page_cache(const checkpoint& ck, bool keep) {
  for (const auto& sh : ck.shards()) keep ? sluice_test::warm_pages(sh.uri) : sluice_test::drop_pages(sh.uri);
}

// A rank's result (run_load) of a load under shared-cooperative: it ended
// well, and the shared tables it digested are the single-process load's.
void require_shared_tables(const nlohmann::json& j, const policy::load_plan& plan, const std::map<std::string, std::string>& ref) {
  REQUIRE(j["exit"] == 0);
  for (auto& [name, sha] : j["digests"].items())
    if (plan.entry(name).shared()) REQUIRE(sha.get<std::string>() == ref.at(name));
}

}  // namespace

TEST_CASE("a one-rank distributed load equals the plain load", "[comm][distributed]") {
  auto ck = checkpoint::open(checkpoint_dir());
  recording_sink s;
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  auto st = load_distributed(ck, "tp1,dp1,ep1", "shared-cooperative", who, s, small_options());
  const auto ref = reference_digests();
  REQUIRE(s.digests.digests().size() == ref.size());
  for (auto& [n, d] : s.digests.digests()) REQUIRE(d.sha256 == ref.at(n));
  REQUIRE(st.bytes_read == ck.tensor_bytes());
  REQUIRE(st.bytes_received == 0);
  REQUIRE(st.shared_bytes > 0);
  REQUIRE(st.shared_views == 4);
  REQUIRE(st.windows > 1);
}

TEST_CASE("a one-rank distributed load with views: the shared tables are views of the file, no segment, the same bytes",
          "[comm][distributed][page_cache]") {
  // As one process's views: a rank alone on its node maps its tables rather
  // than copy them into a segment of its own, cold (its source reads past
  // the page cache, io=automatic, but a table's view is mapped in) or hot.
  // A checkpoint of the test's own: it drops the files' pages.
  const auto dir = sluice_test::fresh_dir("dist-lone-views-ckpt");
  testing::write_checkpoint(dir, small_model());
  auto ck = checkpoint::open(dir);
  const auto ref = reference_digests(dir);
  const auto plan = plan_for(ck, "tp1,dp1,ep1", "shared-cooperative", small_options());
  std::uint64_t tables = 0;
  for (const auto& e : plan.entries)
    if (e.shared()) tables += e.info.size;
  REQUIRE(tables > 0);
  comm::rank_info who;
  who.hostname = "127.0.0.1";
  auto o = small_options();
  o.load.map_above = 1;
  for (const bool hot : {false, true}) {
    INFO((hot ? "hot" : "cold"));
    page_cache(ck, hot);
    recording_sink s;
    const auto st = load_distributed(ck, "tp1,dp1,ep1", "shared-cooperative", who, s, o);
    REQUIRE(s.digests.digests().size() == ref.size());
    for (auto& [n, d] : s.digests.digests()) REQUIRE(d.sha256 == ref.at(n));
    REQUIRE(st.bytes_read == ck.tensor_bytes());
    REQUIRE(st.shared_bytes == 0);
    REQUIRE(st.shared_bytes_written == 0);
    REQUIRE(st.shared_views == 4);
    REQUIRE(st.mapped_bytes >= tables);
  }
  // Under io=direct nothing is a view: the tables go into the segment.
  o.load.io = io_mode::direct;
  recording_sink d;
  const auto st = load_distributed(ck, "tp1,dp1,ep1", "shared-cooperative", who, d, o);
  for (auto& [n, x] : d.digests.digests()) REQUIRE(x.sha256 == ref.at(n));
  REQUIRE(st.shared_bytes_written == tables);
  REQUIRE(st.mapped_bytes == 0);
  fs::remove_all(dir);
}

TEST_CASE("4 ranks, cooperative shared tables: each rank holds exactly its tensors, read once", "[comm][distributed]") {
  check_load(4, "tp1,dp4,ep4", "shared-cooperative");
}

TEST_CASE("4 ranks, cooperative shared tables from the page cache or the disk: written or read into the segment, the same bytes",
          "[comm][distributed][offload]") {
  // The shard files' pages dropped (cold: table bytes read into the
  // segment's mapping), then read (hot: every table byte written from the
  // page cache through the pieces' descriptors).
  auto ck = checkpoint::open(checkpoint_dir());
  const auto ref = reference_digests();
  for (const bool hot : {false, true}) {
    INFO((hot ? "hot" : "cold"));
    page_cache(ck, hot);
    auto opt = small_options();
    opt.plan.local_size = 4;
    const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", opt);
    const auto results = run_load(4, "tp1,dp4,ep4", "shared-cooperative", small_options());
    std::uint64_t written = 0, resident = 0;
    for (std::size_t r = 0; r < 4; ++r) {
      const auto& j = results[r];
      INFO("rank " << r << ": " << j.dump().substr(0, 1500));
      require_shared_tables(j, plan, ref);
      std::uint64_t share = 0;
      for (const auto& e : plan.entries)
        if (e.shared())
          for (const auto& rd : e.reads)
            if (rd.reader == r) share += rd.size;
      REQUIRE(j["stats"]["shared_bytes_written"].get<std::uint64_t>() == share);
      written += share;
      resident += j["stats"]["resident_bytes"].get<std::uint64_t>();
      // Hot, all of it written from the page cache; unless a fault in the
      // segment takes a 2 MiB page here (then faulting it in costs less).
      if (hot) REQUIRE(j["stats"]["resident_bytes"].get<std::uint64_t>() == (shmem_huge_faults() ? 0 : share));
    }
    std::uint64_t tables = 0, released = 0;
    for (const auto& e : plan.entries)
      if (e.shared()) tables += e.info.size;
    REQUIRE(written == tables);  // the node's one copy, its slices written once
    // No sink kept a view: every rank gave its share of the pieces back, the whole segment once.
    for (const auto& j : results) released += j["stats"]["shared_bytes_released"].get<std::uint64_t>();
    REQUIRE(released == results[0]["stats"]["shared_bytes"].get<std::uint64_t>());
    if (!hot) REQUIRE(resident < written);  // dropped pages: read, not written from the page cache
  }
}

TEST_CASE("4 ranks, shared tables from a page cache missing 2 MiB of one: only those bytes are read",
          "[comm][distributed][offload]") {
  // Tables of 4 MiB (so a 2 MiB-aligned range lies inside one), in a
  // checkpoint of this test's own; each rank's share (about 2 MiB) is one read of
  // the plan. Every page cached but that range: the shares are written from
  // the page cache but for it, not sent whole to the reads (asked once per
  // share, 4 of the 8.25 MiB went to the reads).
  if (shmem_huge_faults()) {
    WARN("faults in the segment take 2 MiB pages here: the tables are faulted in, never written from the page cache");
    return;
  }
  const auto dir = sluice_test::fresh_dir("dist-evicted-ckpt");
  auto gen = small_model();
  gen.engram_rows = 32768;
  gen.max_shard_bytes = 1u << 20;
  testing::write_checkpoint(dir, gen);
  auto ck = checkpoint::open(dir);
  const auto ref = reference_digests(dir);
  auto opt = small_options();
  opt.plan.local_size = 4;
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", opt);
  const tensor_ref* table = nullptr;
  for (const auto& e : plan.entries)
    if (e.shared() && (!table || e.info.size > table->size)) table = &ck.tensors()[e.index];
  REQUIRE(table);
  constexpr std::uint64_t mib2 = 2u << 20;
  const auto hole = (table->offset + mib2 - 1) / mib2 * mib2;
  REQUIRE(hole + mib2 <= table->offset + table->size);
  page_cache(ck, true);  // every page in the page cache...
  {  // ...but the 2 MiB-aligned range of the largest table
    const int fd = ::open(ck.shards()[table->shard].uri.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    if (detail::cached_bytes(fd, hole, mib2) == 0) {  // just read: only a kernel without cachestat (before 6.5) says so
      ::close(fd);
      WARN("no cachestat(2) here: nothing counts as cached");
      return;
    }
    REQUIRE(::fdatasync(fd) == 0);  // dirty pages are not dropped
    REQUIRE(::posix_fadvise(fd, static_cast<off_t>(hole), static_cast<off_t>(mib2), POSIX_FADV_DONTNEED) == 0);
    REQUIRE(detail::cached_bytes(fd, hole, mib2) == 0);
    ::close(fd);
  }
  const auto results = run_load(4, "tp1,dp4,ep4", "shared-cooperative", small_options(),
                                [&](std::size_t, fs::path& d) { d = dir; });
  std::uint64_t written = 0, resident = 0, tables = 0;
  for (const auto& e : plan.entries)
    if (e.shared()) tables += e.info.size;
  for (std::size_t r = 0; r < 4; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 1500));
    require_shared_tables(j, plan, ref);
    written += j["stats"]["shared_bytes_written"].get<std::uint64_t>();
    resident += j["stats"]["resident_bytes"].get<std::uint64_t>();
  }
  REQUIRE(written == tables);
  // Every byte but the evicted range's written from the page cache (some of
  // that range may be back, a peer's read ahead, by the time a rank asks).
  REQUIRE(resident >= tables - mib2);
  fs::remove_all(dir);
}

TEST_CASE("a rank that keeps views of the shared segment past the load: no rank releases it, and the views still read the tables",
          "[comm][distributed][offload]") {
  constexpr std::size_t n = 4;
  const auto ref = reference_digests();
  const auto res = on_one_node(n, "dist-keep-store", [&](std::size_t rank, const comm::rank_info& who) {
    auto ck = checkpoint::open(checkpoint_dir());
    struct keeping {  // rank 2 keeps the tables, as an engine serving from them does
      bool keep = false;
      recording_sink s;
      std::vector<tensor_view> tables;
      bool accept(tensor_view v) {
        if (keep && v.kind == view_kind::shared) tables.push_back(v);
        return s.accept(std::move(v));
      }
    } k;
    k.keep = rank == 2;
    const auto st = load_distributed(ck, "tp1,dp4,ep4", "shared-cooperative", who, k, small_options());
    if (st.shared_bytes == 0 || st.shared_views == 0) return 10;
    if (st.shared_bytes_released != 0) return 11;
    // Read after every rank's load returned, and after its peers let go of
    // their mappings: rank 2's views hold what the tables hold.
    digest_sink d;
    for (auto& v : k.tables) (void)d.accept(v);
    if (rank == 2 && d.digests().size() != st.shared_views) return 12;
    for (const auto& [name, dg] : d.digests())
      if (dg.sha256 != ref.at(name)) return 13;
    return 0;
  });
  for (std::size_t r = 0; r < n; ++r) {
    INFO("rank " << r << " (10: no shared tables, 11: the segment released under a kept view, 12: views missing, 13: wrong bytes)");
    CHECK(res[r].code == 0);
  }
}

TEST_CASE("4 ranks, round-robin experts: each rank holds and reads experts r, r + 4, ...", "[comm][distributed]") {
  auto dopt = small_options();
  dopt.plan.experts = policy::expert_placement::round_robin;
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", dopt);
  auto ck = checkpoint::open(checkpoint_dir());
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", dopt);
  std::size_t experts = 0;
  for (const auto& e : plan.entries)
    if (e.info.cls == policy::tensor_class::routed_expert) {
      ++experts;
      REQUIRE(e.owners.members() == std::vector<policy::rank_t>{static_cast<policy::rank_t>(e.info.expert % 4)});
    }
  REQUIRE(experts > 0);
}

TEST_CASE("4 ranks, single-reader shared tables", "[comm][distributed]") {
  check_load(4, "tp1,dp4,ep4", "shared-single");
}

// The ranks of node 0 (one node: all of them) that read shared-table bytes under `plan`.
std::set<std::size_t> table_readers(const policy::load_plan& plan) {
  std::set<std::size_t> readers;
  for (const auto& e : plan.entries)
    if (e.shared())
      for (const auto& r : e.reads)
        if (r.size) readers.insert(r.reader);
  return readers;
}

TEST_CASE("a rank among fewer table readers than local ranks reads the tables with their share of the queue depth",
          "[comm][distributed][sizing]") {
  constexpr std::size_t n = 4;
  auto dopt = small_options();  // queue depth: load_options' default
  // One shared table (the rest ordinary weights): under shared-single one rank reads it alone.
  dopt.classify.table_pattern = R"(engram\.0\.table$)";
  dopt.classify.table_min_bytes = 0;
  const unsigned qd = dopt.load.queue_depth;
  for (const std::string offload : {"shared-single", "shared-cooperative"}) {
    INFO(offload);
    auto ck = checkpoint::open(checkpoint_dir());
    auto popt = dopt;
    popt.plan.local_size = n;
    const auto readers = table_readers(plan_for(ck, "tp1,dp4,ep4", offload, popt));
    if (offload == "shared-single") REQUIRE(readers.size() == 1);  // the lone reader
    else REQUIRE(readers.size() == n);
    const auto results = run_load(n, "tp1,dp4,ep4", offload, dopt);
    std::uint64_t read = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const auto& st = results[r]["stats"];
      INFO("rank " << r << ": " << results[r].dump().substr(0, 1500));
      REQUIRE(results[r]["exit"] == 0);
      REQUIRE(st["table_readers"].get<std::size_t>() == readers.size());
      // A table reader gets the node's depth split among the table readers:
      // alone, all of it (qd x 4); cooperative readers (all ranks) keep their own.
      const unsigned want = readers.contains(r) ? static_cast<unsigned>(qd * n / readers.size()) : 0u;
      REQUIRE(st["table_queue_depth"].get<unsigned>() == want);
      REQUIRE(st["table_connections"].get<std::size_t>() == 0);  // local files
      read += st["bytes_read"].get<std::uint64_t>();
    }
    REQUIRE(read == ck.tensor_bytes());  // each byte read once, the tables' reader included
  }
}

TEST_CASE("reader sizing: the node's I/O split among the ranks reading at once", "[comm][distributed][sizing]") {
  STATIC_REQUIRE(reader_sizing{8, 0, 0}.sharers() == 8);
  STATIC_REQUIRE(reader_sizing{8, 0, 1}.sharers() == 1);
  STATIC_REQUIRE(reader_sizing{8, 0, 3}.queue_depth(4) == 10);
  STATIC_REQUIRE(reader_sizing{8, 0, 1}.queue_depth(4) == 32);
  STATIC_REQUIRE(reader_sizing{8, 0, 0}.queue_depth(4) == 4);
  STATIC_REQUIRE(reader_sizing{2, 0, 9}.queue_depth(4) == 4);  // never less than a rank's own
}

TEST_CASE("4 ranks, tables broadcast to every rank's host memory", "[comm][distributed]") {
  check_load(4, "tp1,dp4,ep4", "per-rank");
}

TEST_CASE("8 ranks TP1/DP8/EP8 with cooperative offload", "[comm][distributed]") {
  check_load(8, "tp1,dp8,ep8", "shared-cooperative");
}

// On one node (local_size 4) the windows carry no message (the page cache
// carries what ranks keep): the failure is reported at the next status
// exchange (window_schedule::status), not the window's own.
TEST_CASE("one rank with a corrupted shard makes every rank fail with a clear error", "[comm][distributed]") {
 for (const std::size_t local : {std::size_t{1}, std::size_t{4}})
 for (const std::uint64_t pieces_above : {std::uint64_t{0}, std::uint64_t{1}}) {  // 1: its reads made at delivery
  INFO("local_size " << local << ", pieces_above " << pieces_above);
  auto ck = checkpoint::open(checkpoint_dir());
  auto opt = small_options();
  opt.plan.local_size = local;
  opt.pieces_above = pieces_above;
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "none", opt);
  // A shard that rank 1 reads from.
  std::string victim;
  std::uint64_t keep = 0;  // cut the shard right after its header
  for (const auto& e : plan.entries)
    for (const auto& r : e.reads)
      if (r.reader == 1 && victim.empty()) {
        const auto& sh = ck.shards()[ck.tensors()[e.index].shard];
        victim = sh.name;
        keep = sh.header.data_start();
      }
  REQUIRE_FALSE(victim.empty());
  const auto copy = sluice_test::fresh_dir("dist-bad");
  // Rank 1 reads a copy whose shard is cut short after its headers were read.
  const auto results = run_load(
      4, "tp1,dp4,ep4", "none", opt,
      [&](std::size_t rank, fs::path& dir) {
        if (rank != 1) return;
        for (auto& f : fs::directory_iterator(checkpoint_dir())) fs::copy_file(f.path(), copy / f.path().filename());
        dir = copy;
      },
      [&](std::size_t rank, const fs::path& dir) {
        if (rank == 1) fs::resize_file(dir / victim, keep);
      });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].dump());
    REQUIRE(results[r]["exit"] == 3);
    REQUIRE_FALSE(results[r]["timed_out"].get<bool>());
    const auto msg = results[r]["error"].get<std::string>();
    REQUIRE_THAT(msg, Catch::Contains("rank 1 failed while reading"));
    REQUIRE_THAT(msg, Catch::Contains(victim));
    // One node: the status exchange that reports it covers the windows since the last one.
    REQUIRE_THAT(msg, Catch::Contains(local == 1 ? "while reading window " : "while reading windows 1-"));
  }
  fs::remove_all(copy);
 }
}

TEST_CASE("a pair's back-to-back slices travel as one message", "[comm][distributed]") {
  auto o = small_options();
  o.plan.local_size = 4;
  auto ck = checkpoint::open(checkpoint_dir());
  const auto plan = plan_for(ck, "tp1,dp4,ep4", "none", o);
  std::uint64_t planned = 0;
  for (const auto& e : plan.entries) plan.for_each_message(e, [&](const policy::planned_message&) { ++planned; });
  const auto results = run_load(4, "tp1,dp4,ep4", "none", o);
  std::uint64_t posted = 0;
  for (const auto& j : results) {
    REQUIRE(j["exit"] == 0);
    posted += j["stats"]["messages"].get<std::uint64_t>();
  }
  INFO("planned " << planned << ", posted " << posted / 2);
  REQUIRE(posted % 2 == 0);  // each message has two ends
  REQUIRE(posted / 2 < planned);
  REQUIRE(posted / 2 <= 12 * plan.windows);  // at most one per ordered pair and window, here
}

TEST_CASE("TP2 x DP2: each rank holds its TP part of split tensors and receives only that", "[comm][distributed][tp]") {
  auto o = small_options();
  o.plan.split_bytes = 4u << 10;  // column-split tensors read in blocks of rows by several ranks
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o);
}

TEST_CASE("page_cache and node_window off: every byte a rank keeps but did not read travels over Gloo, within a node too",
          "[comm][distributed][page_cache]") {
  auto o = small_options();
  o.page_cache = false;
  o.node_window = false;
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o);
}

TEST_CASE("the node window: without the page cache, a node's ranks copy what they keep from the window its readers read into",
          "[comm][distributed][node_window]") {
  // What an S3 load does (its catalog shares no page cache), on local files
  // with the page cache turned off: every topology shape of the tests above,
  // one node and two, TP row and column parts, model parts, a device lane.
  auto o = small_options();
  o.page_cache = false;
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", o);
  check_load(8, "tp1,dp8,ep8", "shared-cooperative", o);
  o.plan.split_bytes = 4u << 10;  // column-split tensors read in blocks of rows by several ranks
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o);
  check_load(4, "tp4,dp1,ep1", "per-rank", o);
  check_load(4, "tp2,dp1,ep2,pp2", "shared-single", o);
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o, lane_mode::emulated);
}

TEST_CASE("the node window, overlapped: a parity is read into again only once every local rank has copied from it",
          "[comm][distributed][node_window]") {
  // Window w + 1 is read while window w travels, so the node window has
  // three parities, and window w + 3 lands where window w lay: it is read
  // only once every rank has copied window w out. A rank slow to copy its
  // first window (300 ms) must then hold the others' reads three windows
  // on, or the bytes it copies are another window's: the digests say which.
  auto o = small_options();
  o.page_cache = false;
  o.overlap = distributed_options::overlap_mode::on;
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", o);
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o, lane_mode::emulated);
  ::setenv("SLUICE_TEST_FAULT", "node copies:1:PAUSE300", 1);
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", o);
  ::unsetenv("SLUICE_TEST_FAULT");
}

TEST_CASE("page-cache views (map_above): what a rank keeps and reads or takes itself comes as a view of the file, the same bytes",
          "[comm][distributed][page_cache]") {
  auto o = small_options();
  o.load.map_above = 1;
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", o);
  check_load_on(2, 2, "tp1,dp2,ep2", "shared-cooperative", o, lane_mode::none);  // a rank alone on its node: its tables too
  o.plan.split_bytes = 4u << 10;  // row parts, slices read by several ranks
  check_load(4, "tp2,dp2,ep4", "none", o);
  check_load(4, "tp1,dp4,ep4", "per-rank", o, lane_mode::emulated);  // the device lane copies as before
}

TEST_CASE("tensors read at delivery (pieces_above): every shape of load delivers the same bytes, each tensor once, in order",
          "[comm][distributed][pieces]") {
  auto o = small_options();
  o.load.max_read = 16u << 10;  // pieces of 16 KiB: several per tensor
  o.pieces_above = 1;           // every tensor a rank gets whole through its own reads
  check_load(4, "tp1,dp4,ep4", "none", o);  // one node (the page cache carries the rest) and two
  o.plan.split_bytes = 4u << 10;
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o);  // row parts, slices read by several ranks
  check_load(4, "tp1,dp4,ep4", "per-rank", o, lane_mode::emulated);  // the host lane's tensors; the device lane's as before
  o.page_cache = false;  // through the node window: only what a rank reads for itself alone
  check_load(4, "tp1,dp4,ep4", "none", o);
  o.overlap = distributed_options::overlap_mode::on;  // the delivery's reads beside the next window's
  check_load(4, "tp1,dp4,ep4", "none", o);
}

// The sink of the test below: every view's place in its tensor, its size
// and its buffer, by tensor (placeholders aside), and each tensor's bytes.
struct pieces_seen {
  struct piece {
    std::uint64_t offset = 0, size = 0, buffer = 0;
    view_kind kind = view_kind::bytes;
  };
  std::map<std::string, std::vector<piece>> views;
  std::map<std::string, std::vector<std::byte>> bytes;
  bool accept(tensor_view v) {
    if (!v.carries_data()) return true;
    views[v.name()].push_back({v.offset, v.bytes.size(), v.hold ? v.hold.bytes().size() : 0, v.kind});
    auto& b = bytes[v.name()];
    b.resize(v.part_size());
    if (!v.bytes.empty()) std::memcpy(b.data() + v.offset, v.bytes.data(), v.bytes.size());
    return true;
  }
};

struct whole_pieces_seen : pieces_seen {
  static constexpr bool whole_tensors = true;
};

TEST_CASE("a large tensor a rank gets whole through its own reads comes in ordered pieces, into its destination, or whole "
          "to a sink that wants it whole, never in a window buffer its size",
          "[comm][distributed][pieces]") {
  constexpr std::size_t n = 4;
  constexpr std::uint64_t above = 256u << 10, max_read = 64u << 10;
  auto whole_bytes = [](const checkpoint& ck, const std::string& name) {
    for (const auto& t : ck.tensors())
      if (t.name == name) {
        std::vector<std::byte> b(t.size);
        std::ifstream f(ck.shards()[t.shard].uri, std::ios::binary);
        f.seekg(static_cast<std::streamoff>(t.offset));
        f.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(t.size));
        return b;
      }
    return std::vector<std::byte>{};
  };
  const auto res = on_one_node(n, "dist-pieces-store", [&](std::size_t rank, const comm::rank_info& who) {
    comm::gloo c(who);
    auto ck = checkpoint::open(checkpoint_dir());
    auto o = small_options();
    o.plan.local_size = n;
    o.load.max_read = max_read;
    o.pieces_above = above;
    const auto plan = plan_for(ck, "tp1,dp4,ep4", "none", o);
    // One node, every byte through the page cache, nothing split: each
    // tensor this rank keeps of at least `above` bytes is read at delivery
    // (every rank keeps the tables: offload none).
    std::set<std::string> large;
    std::uint64_t large_bytes = 0, smallest = ~std::uint64_t{0};
    for (const auto& e : plan.entries)
      if (e.owners.contains(static_cast<policy::rank_t>(rank)) && e.info.size >= above)
        large.insert(e.info.name), large_bytes += e.info.size, smallest = std::min(smallest, e.info.size);
    if (large.empty()) return 10;
    // In pieces: in order, back to back, each at most a read request in a
    // buffer of that size, the same bytes as the file; the rest whole, in
    // window buffers smaller than any large tensor.
    {
      o.buffers = std::make_shared<window_buffers>();
      pieces_seen s;
      const auto st = load_distributed(ck, c, plan, s, o);
      if (st.delivered_read_bytes != large_bytes) return 11;
      for (const auto& [name, views] : s.views) {
        if (s.bytes[name] != whole_bytes(ck, name)) return 12;
        if (!large.contains(name)) {
          if (views.size() != 1 || views[0].buffer >= smallest) return 13;
          continue;
        }
        if (views.size() < 2) return 14;
        std::uint64_t at = 0;
        for (const auto& p : views) {
          if (p.offset != at || p.size > max_read || p.buffer > max_read || p.kind != view_kind::bytes) return 14;
          at += p.size;
        }
      }
      if (s.views.size() != st.owned) return 15;
    }
    // The same load without it: the large tensors lie whole in window
    // buffers, which stay in reserve between loads at their size.
    {
      auto whole = o;
      whole.pieces_above = 0;
      whole.buffers = std::make_shared<window_buffers>();
      pieces_seen s;
      const auto st = load_distributed(ck, c, plan, s, whole);
      if (st.delivered_read_bytes != 0) return 17;
      for (const auto& name : large)
        if (s.views.at(name).size() != 1 || s.views.at(name)[0].buffer < smallest) return 17;
      if (o.buffers->stats().live_bytes >= whole.buffers->stats().live_bytes) return 16;
    }
    // A sink with a destination of its own: read straight there, one placed view.
    {
      struct destined : pieces_seen {
        std::map<std::string, std::vector<std::byte>> dst;
        std::span<std::byte> direct_destination(const tensor_ref& t) {
          auto& d = dst[t.name];
          d.resize(t.size);
          return d;
        }
      } s;
      const auto st = load_distributed(ck, c, plan, s, o);
      if (st.delivered_read_bytes != large_bytes) return 18;
      for (const auto& name : large) {
        const auto& v = s.views.at(name);
        if (v.size() != 1 || v[0].kind != view_kind::placed || s.dst.at(name) != whole_bytes(ck, name)) return 18;
      }
    }
    // A sink that wants whole tensors gets them whole, from the windows.
    {
      whole_pieces_seen s;
      const auto st = load_distributed(ck, c, plan, s, o);
      if (st.delivered_read_bytes != 0) return 19;
      for (const auto& [name, views] : s.views)
        if (views.size() != 1 || s.bytes[name] != whole_bytes(ck, name)) return 19;
    }
    return 0;
  });
  for (std::size_t r = 0; r < n; ++r) {
    INFO("rank " << r << " (10: no large tensor, 11: read at delivery not the large ones, 12: wrong bytes, 13: a small "
                 "tensor in pieces or a large buffer, 14: pieces out of order or larger than a read, 15: tensors lost, "
                 "16: window buffers kept as large as without it, 17: without pieces_above, 18: not into the sink's "
                 "destination, 19: a whole-tensor sink got pieces)");
    CHECK(res[r].code == 0);
  }
}

TEST_CASE("4 ranks, parts the engine's model chose: each rank holds its blocks, in the model's order, and receives only those",
          "[comm][distributed][model_owners]") {
  // As the vLLM layer's dry runs would say: 2-D tensors cut in rows among
  // all four ranks (two replicas, parts in reverse rank order), or in
  // columns between ranks 2 and 3; 1-D ones whole on rank 3 alone.
  auto ck = checkpoint::open(checkpoint_dir());
  auto owners = std::make_shared<std::map<std::string, policy::model_owner>>();
  std::size_t rows = 0, cols = 0;
  for (const auto& t : ck.tensors()) {
    auto& m = (*owners)[t.name];
    if (t.size == 0) {
      m.ranks = {0, 1, 2, 3};
    } else if (t.shape.size() == 2 && t.shape[0] % 2 == 0 && (rows <= cols || t.shape[1] % 2)) {
      m = {{0, 1, 2, 3}, policy::tp_split::rows, 2, {1, 0, 1, 0}};
      ++rows;
    } else if (t.shape.size() == 2 && t.shape[1] % 2 == 0) {
      m = {{2, 3}, policy::tp_split::columns, 2, {1, 0}};
      ++cols;
    } else {
      m.ranks = {3};
    }
  }
  REQUIRE(rows > 0);
  REQUIRE(cols > 0);
  auto o = small_options();
  o.plan.split_bytes = 4u << 10;  // column-split tensors read in blocks of rows by both owners
  o.plan.model_owners = owners;
  check_load(4, "tp1,dp4,ep1", "none", o);
}

TEST_CASE("4 ranks, a fused tensor's runs: each rank holds its block of every run, packed, and receives only those",
          "[comm][distributed][model_owners]") {
  // A merged column-parallel layer (gate and up in one tensor, LFM2's
  // in_proj) narrows each run of dim 0 to its TP block: the model's split
  // says groups 2 or 4 runs of dim 0, or 2 runs of dim 1, each cut in 2, or
  // runs of dim 0 of unequal sizes (a QKV of grouped-query attention).
  auto ck = checkpoint::open(checkpoint_dir());
  auto owners = std::make_shared<std::map<std::string, policy::model_owner>>();
  std::size_t by_rows = 0, by_cols = 0;
  for (const auto& t : ck.tensors()) {
    auto& m = (*owners)[t.name];
    if (t.size && t.shape.size() == 2 && t.shape[0] % 8 == 0 && by_rows <= by_cols) {
      if (by_rows % 3 == 2) {   // unequal runs (a GQA QKV): a half, then two quarters of the rows
        m = {{0, 1, 2, 3}, policy::tp_split::rows, 2, {0, 1, 1, 0}, 1, {t.shape[0] / 2, t.shape[0] / 4, t.shape[0] / 4}};
      } else {
        const std::uint32_t runs = by_rows % 3 ? 4 : 2;
        m = {{0, 1, 2, 3}, policy::tp_split::rows, 2, {0, 1, 1, 0}, runs};
      }
      ++by_rows;
    } else if (t.size && t.shape.size() == 2 && t.shape[1] % 4 == 0) {
      m = {{1, 2}, policy::tp_split::columns, 2, {1, 0}, 2};
      ++by_cols;
    } else {
      m.ranks = {0, 1, 2, 3};
    }
  }
  REQUIRE(by_rows > 2);
  REQUIRE(by_cols > 0);
  auto o = small_options();
  o.plan.split_bytes = 4u << 10;  // runs read in blocks by several owners
  o.plan.model_owners = owners;
  check_load(4, "tp1,dp4,ep1", "none", o);
}

TEST_CASE("TP4: row and column parts, one rank per part", "[comm][distributed][tp]") {
  check_load(4, "tp4,dp1,ep4", "none");
  auto o = small_options();
  o.plan.split_bytes = 4u << 10;
  check_load(4, "tp4,dp1,ep2", "per-rank", o);
  check_load(4, "tp4,dp1,ep1", "shared-cooperative", o);  // no EP: experts split by TP too
}

TEST_CASE("TP2 x PP2: parts within each stage, stages apart", "[comm][distributed][tp][pp]") {
  check_load(4, "tp2,dp1,ep2,pp2", "shared-single");
}

TEST_CASE("a device lane: device tensors travel in lane memory, host tables over Gloo", "[comm][distributed][lane]") {
  // Tables destined for each rank's host memory travel over Gloo as bytes;
  // everything else is uploaded into lane memory, exchanged there and
  // delivered as device views (check_load: digests, exact bytes, call order).
  check_load(4, "tp1,dp4,ep4", "per-rank", small_options(), lane_mode::emulated);
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", small_options(), lane_mode::emulated);
  auto o = small_options();
  o.overlap = distributed_options::overlap_mode::on;  // uploads and exchange on the helper thread
  check_load(4, "tp1,dp4,ep4", "none", o, lane_mode::emulated);
}

TEST_CASE("a device lane under TP: row parts uploaded as read, column parts as cut", "[comm][distributed][lane][tp]") {
  auto o = small_options();
  o.plan.split_bytes = 4u << 10;  // column-split tensors read in blocks of rows by several ranks
  check_load(4, "tp2,dp2,ep4", "shared-cooperative", o, lane_mode::emulated);
  check_load(4, "tp4,dp1,ep1", "per-rank", small_options(), lane_mode::emulated);
}

// Without the erasure it does not compile (tests/compile_fail/host_sink_with_device_lane.cpp);
// with it, any_sink's traits say so before any read.
TEST_CASE("a device lane into a host sink behind any_sink fails every rank before any read, naming the sink", "[comm][distributed][lane]") {
  const auto results = run_load(4, "tp1,dp4,ep4", "per-rank", small_options(), {}, {}, lane_mode::emulated_host_sink);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].dump().substr(0, 2000));
    REQUIRE(results[r]["exit"] == 3);
    REQUIRE_FALSE(results[r]["timed_out"].get<bool>());
    const auto msg = results[r]["error"].get<std::string>();
    REQUIRE_THAT(msg, Catch::Contains("rank 0 failed while checking the sink"));  // before setting up I/O
    REQUIRE_THAT(msg, Catch::Contains("the sink (sluice::v0::digest_sink) takes none"));
  }
}

TEST_CASE("one rank with a device lane: everything uploaded, nothing exchanged", "[comm][distributed][lane]") {
  auto ck = checkpoint::open(checkpoint_dir());
  auto o = small_options();
  const auto plan = plan_for(ck, "tp1,dp1,ep1", "per-rank", o);
  comm::local c;
  testing::emulated_device_lane lane(c);
  recording_sink s;
  const auto st = load_distributed(ck, c, plan, s, o, lane);
  const auto ref = reference_digests();
  REQUIRE(s.digests.digests().size() == ref.size());
  for (auto& [n, d] : s.digests.digests()) REQUIRE(d.sha256 == ref.at(n));
  std::uint64_t device_bytes = 0, device_tensors = 0;
  for (const auto& e : plan.entries)
    if (e.owner_destination == policy::destination::device) device_bytes += e.info.size, device_tensors += 1;
  REQUIRE(st.device_views == device_tensors);
  REQUIRE(s.device.size() == device_tensors);
  REQUIRE(st.bytes_uploaded == device_bytes);  // each device byte uploaded once
  REQUIRE(lane.uploaded_bytes() == device_bytes);
  REQUIRE(lane.uploads() < device_tensors);  // adjacent reads travel up as one copy
  REQUIRE(st.bytes_received == 0);
}

TEST_CASE("window buffers kept between loads are reused, a sink holding every view bounds them, and the loads deliver the same tensors", "[comm][distributed]") {
  constexpr std::size_t n = 4;
  const auto ref = reference_digests();
  const auto res = on_one_node(n, "dist-reuse-store", [&](std::size_t rank, const comm::rank_info& who) {
    comm::gloo c(who);
    auto ck = checkpoint::open(checkpoint_dir());
    auto o = small_options();
    o.plan.local_size = n;
    o.buffers = std::make_shared<window_buffers>();
    const auto plan = plan_for(ck, "tp1,dp4,ep4", "none", o);
    // The window buffers each load's tensors lay in (a lease's bytes start its buffer).
    struct buffers_seen {
      recording_sink s;
      std::set<const std::byte*> at;
      bool accept(tensor_view v) {
        if (v.kind == view_kind::bytes) at.insert(v.hold.bytes().data());
        return s.accept(std::move(v));
      }
    } a, b;
    (void)load_distributed(ck, c, plan, a, o);
    (void)load_distributed(ck, c, plan, b, o);
    if (a.s.digests.digests().empty() || a.at.empty()) return 10;
    for (const auto& [name, d] : a.s.digests.digests())
      if (d.sha256 != ref.at(name) || b.s.digests.digests().at(name).sha256 != d.sha256) return 11;
    if (a.s.digests.digests().size() != b.s.digests.digests().size()) return 12;
    // The first load's kept buffers (both window parities, each sized for
    // the largest window) came back; the second reuses those and allocates none.
    if (b.at.size() > 2) return 13;
    for (const auto* p : b.at)
      if (!a.at.contains(p)) return 13;
    // A sink that holds every view until the end (an engine keeping the
    // window's bytes as its weights): each window then takes buffers of
    // its own, and the load holds no more than those plus its reserve;
    // once the sink lets go, only the reserve stays.
    struct holding {
      recording_sink s;
      std::vector<lease> held;
      bool accept(tensor_view v) {
        if (v.hold) held.push_back(v.hold);
        return s.accept(std::move(v));
      }
    } h;
    (void)load_distributed(ck, c, plan, h, o);
    for (const auto& [name, d] : h.s.digests.digests())
      if (d.sha256 != ref.at(name)) return 11;
    const auto sched = policy::make_schedule(plan, policy::lane_split::one, policy::node_copy::page_cache);
    std::uint64_t kept = 0, scratch = 0, windows_kept = 0;
    for (const auto& w : sched.windows) {
      const auto& lay = w.lanes.at(0).ranks.at(rank);
      kept = std::max(kept, lay.kept_bytes), scratch = std::max(scratch, lay.scratch_bytes);
      windows_kept += lay.kept_bytes > 0;
    }
    const auto reserve = o.buffers->capacity_for(kept) + o.buffers->capacity_for(scratch);
    if (o.buffers->stats().live_bytes > windows_kept * o.buffers->capacity_for(kept) + 2 * reserve) return 14;
    h.held.clear();
    if (o.buffers->stats().live_bytes > 2 * reserve) return 15;
    return 0;
  });
  for (std::size_t r = 0; r < n; ++r) {
    INFO("rank " << r << " (10: nothing held, 11: wrong bytes, 12: different tensors, 13: buffers not reused, "
                 "14: more memory than the held windows and the reserve, 15: more than the reserve once let go)");
    CHECK(res[r].code == 0);
  }
}

TEST_CASE("window reads overlapped with the collectives, or serial, deliver the same tensors", "[comm][distributed]") {
  auto o = small_options();
  o.overlap = distributed_options::overlap_mode::on;
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", o);
  o.overlap = distributed_options::overlap_mode::off;
  check_load(4, "tp1,dp4,ep4", "shared-cooperative", o);
}

TEST_CASE("automatic overlap needs two hardware threads per local rank, or remote storage", "[comm][distributed]") {
  distributed_options o;
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  CHECK(o.overlaps(hw / 2 == 0 ? 1 : hw / 2) == (hw >= 2));
  CHECK_FALSE(o.overlaps(hw));
  CHECK(o.overlaps(hw, true));  // remote storage: reads wait on the network, not the cores
  o.overlap = distributed_options::overlap_mode::on;
  CHECK(o.overlaps(hw * 4));
  o.overlap = distributed_options::overlap_mode::off;
  CHECK_FALSE(o.overlaps(1));
  CHECK_FALSE(o.overlaps(1, true));
}

namespace {
// Its process is killed (SIGKILL: no exception, no goodbye) at its 5th call.
struct dying_sink {
  int calls = 0;
  bool accept(tensor_view) {
    if (++calls == 5) ::kill(::getpid(), SIGKILL);
    return true;
  }
};
}  // namespace

TEST_CASE("a rank killed mid-load makes the others fail with comm_error, not hang", "[comm][distributed]") {
  // What a survivor must see is the dead peer: its sockets closed, which every
  // survivor learns from the dead rank or from a survivor that closed its own
  // connections on failing. The timeout only bounds a hang, so it is far above
  // what a busy machine takes to start four ranks and meet (with a short one, a
  // slow start can fail the rendezvous before rank 2 ever dies); a comm_error
  // that is a timeout, not the lost peer, fails the test (code 44). A survivor killed
  // by SIGPIPE (writing to the dead peer's socket: the failure seen on a busy
  // machine before comm::gloo ignored SIGPIPE) shows as -13.
  const auto store = sluice_test::fresh_dir("dist-kill");
  const auto& ckdir = checkpoint_dir();
  auto res = sluice_test::run_ranks(
      4,
      [&](std::size_t rank) {
        comm::rank_info who;
        who.hostname = "127.0.0.1";  // every "node" of the test is this machine
        who.rank = rank, who.world_size = 4, who.local_rank = rank, who.local_size = 4;
        who.store_dir = store.string();
        who.timeout = 120s;
        auto ck = checkpoint::open(ckdir);
        try {
          if (rank == 2) {
            dying_sink s;
            (void)load_distributed(ck, "tp1,dp4,ep4", "shared-cooperative", who, s, small_options());
          } else {
            recording_sink s;
            (void)load_distributed(ck, "tp1,dp4,ep4", "shared-cooperative", who, s, small_options());
          }
        } catch (const comm::comm_error& e) {
          std::fprintf(stderr, "rank %zu: %s\n", rank, e.what());
          std::string m = e.what();
          for (auto& ch : m) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          return m.find("timeout") != std::string::npos || m.find("timed out") != std::string::npos ? 44 : 42;
        } catch (const std::exception& e) {  // named, so that a failure says what was thrown instead
          std::fprintf(stderr, "rank %zu: not a comm_error: %s\n", rank, e.what());
          return 43;
        }
        return 0;
      },
      300s);
  fs::remove_all(store);
  REQUIRE(res[2].code == -SIGKILL);
  for (std::size_t r : {0, 1, 3}) {
    INFO("rank " << r << " (42: comm_error, 43: another exception, 44: a timeout, not the dead peer; printed on stderr; "
                 << "timed out: " << res[r].timed_out << ")");
    REQUIRE(res[r].code == 42);
  }
}

namespace {
// An emulated device lane whose process dies (no exception, no goodbye) in
// its `die_at`-th exchange: a dead peer in the middle of a device exchange.
template <class Comm>
struct dying_lane : testing::emulated_device_lane<Comm> {
  using testing::emulated_device_lane<Comm>::emulated_device_lane;
  int exchanges = 0, die_at = 0;
  // At exchange die_at it takes what its peers send it, then dies sending
  // nothing: a peer that sends to it is then inside its own exchange, waiting
  // for this rank's messages, however busy the machine. (Dying as the
  // exchange began, on a busy machine every peer sometimes met the death
  // before its own exchange: 3 runs in 30, two copies of the test at once.)
  void exchange(std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) {
    if (++exchanges == die_at) {
      testing::emulated_device_lane<Comm>::exchange({}, recvs);
      ::_exit(9);
    }
    testing::emulated_device_lane<Comm>::exchange(sends, recvs);
  }
};
}  // namespace

TEST_CASE("a peer dead during a device-lane exchange: the others throw peer_lost and free all lane memory", "[comm][distributed][lane]") {
  // What must hold for comm::nccl_lane on a GPU, in the emulation: the ranks
  // waiting on the dead one throw comm::peer_lost naming it (the peer watch
  // of the host communicator the emulated lane exchanges over; the timeout,
  // 300 s, is far beyond the test's 90 s: a wait for it fails the test), the
  // lanes whose exchange failed are aborted, and once the load has unwound
  // and the lane let go, no lane memory is left.
  // Codes: 42 aborted in its exchange, 43 failed later (its own exchange had
  // completed), 10 wrong exception or another rank named, 11 lane memory
  // left, 12 no failure.
  const auto store = sluice_test::fresh_dir("dist-lane-kill");
  auto res = sluice_test::run_ranks(
      4,
      [&](std::size_t rank) {
        comm::rank_info who;
        who.hostname = "127.0.0.1";  // every "node" of the test is this machine
        // One node, every byte over the lane and the host communicator (the
        // page cache and the node window off), so that every rank has lane
        // messages with the dying one.
        who.rank = rank, who.world_size = 4, who.local_rank = rank, who.local_size = 4;
        who.store_dir = store.string();
        who.timeout = 300s;
        auto ck = checkpoint::open(checkpoint_dir());
        comm::gloo c(who);
        auto o = small_options();
        o.plan.local_size = 4;
        o.page_cache = false;
        o.node_window = false;
        const auto plan = plan_for(ck, "tp1,dp4,ep4", "shared-cooperative", o);
        if (plan.windows < 3) return 13;
        dying_lane<comm::gloo> lane(c);
        lane.die_at = rank == 2 ? 2 : 0;
        try {
          recording_sink s;
          (void)load_distributed(ck, c, plan, s, o, lane);
        } catch (const comm::peer_lost& e) {
          std::fprintf(stderr, "rank %zu: %s\n", rank, e.what());
          if (e.lost_rank() != 2) return 10;
          const bool aborted = lane.aborted();
          lane.release();
          if (lane.live_bytes() != 0) return 11;
          return aborted ? 42 : 43;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %zu: unexpected %s\n", rank, e.what());
          return 10;
        }
        return 12;
      },
      90s);
  fs::remove_all(store);
  REQUIRE(res[2].code == 9);
  int aborted = 0;
  for (std::size_t r : {0, 1, 3}) {
    INFO("rank " << r << " (42/43: peer_lost, lane aborted or not; 10: wrong error; 11: lane memory left; 12: no failure; 13: too few windows)");
    REQUIRE_FALSE(res[r].timed_out);
    REQUIRE((res[r].code == 42 || res[r].code == 43));
    aborted += res[r].code == 42;
  }
  REQUIRE(aborted > 0);  // at least one rank was waiting on the dead one inside the lane's exchange
}

namespace {

// Four ranks call the tool-level load_distributed, rank r on where(r); every
// one must throw distributed_error naming `failed_rank`'s open failure and `victim`.
void require_every_rank_fails_opening(const std::string& tag, const std::function<fs::path(std::size_t)>& where,
                                      const std::string& offload, std::size_t failed_rank, const std::string& victim) {
  const auto store = sluice_test::fresh_dir(tag + "-store");
  const auto out = sluice_test::fresh_dir(tag + "-out");
  auto res = sluice_test::run_ranks(
      4,
      [&](std::size_t rank) {
        comm::rank_info who;
        who.hostname = "127.0.0.1";  // every "node" of the test is this machine
        who.rank = rank, who.world_size = 4, who.local_rank = rank, who.local_size = 4;
        who.store_dir = store.string();
        who.timeout = 60s;  // the failure must not wait for it
        recording_sink s;
        try {
          (void)load_distributed(where(rank), "tp1,dp4,ep4", offload, who, s, small_options());
        } catch (const distributed_error& e) {
          std::ofstream(out / fmt::format("rank{}.txt", rank)) << e.what() << "\n" << e.failed_rank();
          return 5;
        }
        return 0;
      },
      50s);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(res[r].code == 5);
    std::ifstream f(out / fmt::format("rank{}.txt", r));
    std::string msg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    REQUIRE_THAT(msg, Catch::Contains(fmt::format("rank {} failed while opening the checkpoint", failed_rank)));
    REQUIRE_THAT(msg, Catch::Contains(victim));
  }
  fs::remove_all(store);
  fs::remove_all(out);
}

}  // namespace

TEST_CASE("a rank that cannot open its checkpoint fails every rank at once", "[comm][distributed]") {
  const auto copy = sluice_test::fresh_dir("dist-open-bad");
  for (auto& f : fs::directory_iterator(checkpoint_dir())) fs::copy_file(f.path(), copy / f.path().filename());
  const auto victim = checkpoint::open(checkpoint_dir()).shards().back().name;
  fs::resize_file(copy / victim, fs::file_size(copy / victim) / 2);  // a truncated shard: its header promises more
  require_every_rank_fails_opening(
      "dist-open", [&](std::size_t rank) { return rank == 3 ? copy : checkpoint_dir(); }, "shared-single", 3, victim);
  fs::remove_all(copy);
}

TEST_CASE("a group is checked: duplicates, ranks outside the world and empty names are config errors", "[comm][groups]") {
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = 0, who.world_size = 4, who.store_dir = "/nonexistent";
  const std::vector<std::size_t> dup{0, 2, 2}, outside{0, 4}, fine{1, 3};
  REQUIRE_THROWS_WITH(comm::gloo::group(who, dup, "g"), Catch::Contains("rank 2 is listed twice"));
  REQUIRE_THROWS_WITH(comm::gloo::group(who, outside, "g"), Catch::Contains("rank 4 is not in the world of 4"));
  REQUIRE_THROWS_AS(comm::gloo::group(who, fine, ""), config_error);
  REQUIRE_FALSE(comm::gloo::group(who, fine, "g").has_value());  // not a member: nothing touched
}

TEST_CASE("a load on the subgroup {0, 2, 5} of six ranks, the others are untouched", "[comm][distributed][groups]") {
  const auto ref = reference_digests();
  const auto store = sluice_test::fresh_dir("group-store");
  const auto out = sluice_test::fresh_dir("group-out");
  const std::vector<std::size_t> members{0, 2, 5};
  auto opt = small_options();
  opt.plan.local_size = members.size();
  opt.plan.uneven_experts = true;  // 8 experts per layer over EP=3
  auto res = sluice_test::run_ranks(6, [&](std::size_t rank) {
    comm::rank_info who;
    who.hostname = "127.0.0.1";  // every "node" of the test is this machine
    who.rank = rank, who.world_size = 6, who.local_rank = rank, who.local_size = 6;
    who.store_dir = store.string();
    who.timeout = 20s;
    auto c = comm::gloo::group(who, members, "trio");
    if (!c) return 0;  // outside the group: no collective, no store key
    auto ck = checkpoint::open(checkpoint_dir());
    const auto plan = plan_for(ck, "tp1,dp3,ep3", "shared-cooperative", opt);
    recording_sink s;
    const auto st = load_distributed(ck, *c, plan, s, opt);
    nlohmann::json j;
    j["group_rank"] = c->rank();
    j["bytes_read"] = st.bytes_read;
    j["stats"] = st.to_json();
    for (auto& [name, d] : s.digests.digests()) j["digests"][name] = d.sha256;
    sluice_test::write_rank_json(out, rank, j);
    return 0;
  });
  for (std::size_t r = 0; r < 6; ++r) REQUIRE(res[r].code == 0);
  auto ck = checkpoint::open(checkpoint_dir());
  const auto plan = plan_for(ck, "tp1,dp3,ep3", "shared-cooperative", opt);
  std::uint64_t read = 0;
  for (std::size_t r = 0; r < 6; ++r) {
    const bool member = r == 0 || r == 2 || r == 5;
    REQUIRE(fs::exists(out / fmt::format("rank{}.json", r)) == member);
    if (!member) continue;
    nlohmann::json j;
    std::ifstream(out / fmt::format("rank{}.json", r)) >> j;
    const auto g = j["group_rank"].get<std::size_t>();
    REQUIRE(members[g] == r);
    std::set<std::string> owned, got;
    for (const auto& e : plan.entries)
      if (e.owners.contains(static_cast<policy::rank_t>(g))) owned.insert(e.info.name);
    for (auto& [name, sha] : j["digests"].items()) {
      got.insert(name);
      REQUIRE(sha.get<std::string>() == expected_digest(plan, plan.entry(name), static_cast<policy::rank_t>(g), ck, ref));
    }
    REQUIRE(got == owned);
    // One node (local_size: the group's size): what the plan sends a rank
    // comes from the page cache instead, nothing over Gloo.
    REQUIRE(j["stats"]["bytes_received"].get<std::uint64_t>() == 0);
    REQUIRE(j["stats"]["page_cache_bytes"].get<std::uint64_t>() == plan.received_bytes[g]);
    read += j["bytes_read"].get<std::uint64_t>();
  }
  REQUIRE(read == ck.tensor_bytes());
  // The rendezvous holds the group's keys only, under its name.
  std::vector<std::string> top;
  for (auto& e : fs::directory_iterator(store)) top.push_back(e.path().filename().string());
  REQUIRE(top == std::vector<std::string>{"group-trio"});
  fs::remove_all(store);
  fs::remove_all(out);
}

TEST_CASE("ranks with nothing to read take part in every collective and finish", "[comm][distributed][groups]") {
  // Two small tensors, four ranks: two ranks are idle readers.
  const auto dir = sluice_test::fresh_dir("idle-ck");
  std::vector<std::byte> a(3000), b(5000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::byte>(i * 7);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 13 + 1);
  format::writer().add("model.norm.weight", format::dtype::U8, {a.size()}, a)
      .add("model.embed_tokens.weight", format::dtype::U8, {b.size()}, b)
      .write(dir / "model.safetensors");
  const auto store = sluice_test::fresh_dir("idle-store");
  const auto out = sluice_test::fresh_dir("idle-out");
  auto res = sluice_test::run_ranks(4, [&](std::size_t rank) {
    comm::rank_info who;
    who.hostname = "127.0.0.1";  // every "node" of the test is this machine
    who.rank = rank, who.world_size = 4, who.local_rank = rank, who.local_size = 4;
    who.store_dir = store.string();
    who.timeout = 20s;
    recording_sink s;
    auto ck = checkpoint::open(dir);
    const auto st = load_distributed(ck, "tp1,dp4,ep4", "none", who, s, small_options());
    nlohmann::json j;
    j["planned"] = st.planned_read_bytes;
    for (auto& [name, d] : s.digests.digests()) j["digests"][name] = d.sha256;
    sluice_test::write_rank_json(out, rank, j);
    return 0;
  });
  digest_sink ref;
  (void)load(checkpoint::open(dir), ref, load_options{.staging_budget = 1u << 20, .max_read = 64u << 10, .register_buffers = false});
  std::size_t idle = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    REQUIRE(res[r].code == 0);
    nlohmann::json j;
    std::ifstream(out / fmt::format("rank{}.json", r)) >> j;
    idle += j["planned"].get<std::uint64_t>() == 0 ? 1 : 0;
    REQUIRE(j["digests"].size() == 2);
    for (auto& [name, sha] : j["digests"].items()) REQUIRE(sha.get<std::string>() == ref.digests().at(name).sha256);
  }
  REQUIRE(idle >= 2);
  fs::remove_all(dir);
  fs::remove_all(store);
  fs::remove_all(out);
}

namespace {
// A sink that sizes its memory from the plan, as cuda::device_sink does: the
// driver calls reserve() once the ranks agree on the plan, before any read.
struct reserving_sink : sluice_test::recording_sink {
  int reserves = 0;
  bool throw_in_reserve = false, view_before_reserve = false, wrong_size = false;
  std::map<std::string, std::uint64_t> sizes;  // device tensors this rank keeps, at their part sizes
  void reserve(const policy::load_plan& plan, policy::rank_t rank) {
    if (throw_in_reserve) throw config_error("cannot reserve device memory (test)");
    ++reserves;
    for (const auto& e : plan.entries)
      if (e.owners.contains(rank) && e.owner_destination == policy::destination::device) sizes[e.info.name] = plan.kept_bytes(e);
  }
  bool accept(tensor_view v) {
    if (!reserves) view_before_reserve = true;
    if (v.kind == view_kind::bytes && !host_resident(v)) {
      const auto it = sizes.find(v.name());
      if (it == sizes.end() || it->second != v.bytes.size()) wrong_size = true;
    }
    return recording_sink::accept(std::move(v));
  }
};
}  // namespace

TEST_CASE("a sink that reserves from the plan is asked once, before any view, at its parts' sizes", "[comm][distributed][tp]") {
  // Codes: 0 fine; 20 reserve() not called exactly once; 21 a view came first;
  // 22 a device tensor arrived at a size the reservation does not have;
  // 23 nothing reserved; 30 distributed_error naming rank 2's reserve; 31 another error.
  for (const bool failing : {false, true}) {
    INFO((failing ? "rank 2's reserve throws" : "every reserve succeeds"));
    const auto store = sluice_test::fresh_dir("dist-reserve");
    const auto res = sluice_test::run_ranks(
        4,
        [&](std::size_t rank) {
          comm::rank_info who;
          who.hostname = "127.0.0.1";  // every "node" of the test is this machine
          who.rank = rank, who.world_size = 4, who.local_rank = rank, who.local_size = 4;
          who.store_dir = store.string();
          who.timeout = 20s;
          reserving_sink s;
          s.throw_in_reserve = failing && rank == 2;
          try {
            (void)load_distributed(checkpoint::open(checkpoint_dir()), "tp2,dp2,ep1", "per-rank", who, s, small_options());
          } catch (const distributed_error& e) {
            const std::string m = e.what();
            std::fprintf(stderr, "rank %zu: %s\n", rank, m.c_str());
            return m.find("rank 2 failed while reserving the sink's memory") != std::string::npos ? 30 : 31;
          }
          if (s.reserves != 1) return 20;
          if (s.view_before_reserve) return 21;
          if (s.wrong_size) return 22;
          if (s.sizes.empty()) return 23;
          return 0;
        },
        90s);
    fs::remove_all(store);
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(res[r].code == (failing ? 30 : 0));
    }
  }
}

// checkpoint::open(location, communicator): rank 0 reads the metadata and
// shares it; the others open by replaying what its storage answered.
namespace {

// A JSON description of an error: its class (most derived of those the
// contract names), rule or failed rank, and what().
nlohmann::json describe(const std::exception& e) {
  nlohmann::json j{{"what", e.what()}};
  if (const auto* x = dynamic_cast<const index_error*>(&e)) {
    j["type"] = "index_error";
    j["rule"] = x->rule();
  } else if (const auto* y = dynamic_cast<const format_error*>(&e)) {
    j["type"] = "format_error";
    j["rule"] = y->rule();
  } else if (const auto* z = dynamic_cast<const distributed_error*>(&e)) {
    j["type"] = "distributed_error";
    j["failed_rank"] = z->failed_rank();
  } else {
    j["type"] = dynamic_cast<const io_error*>(&e) ? "io_error" : "other";
  }
  return j;
}

// Runs `n` ranks that meet through Gloo and return body(rank, communicator);
// an exception is recorded as {"error": describe(e)}.
std::vector<nlohmann::json> run_collective(std::size_t n, const std::function<nlohmann::json(std::size_t, comm::gloo&)>& body) {
  const auto store = sluice_test::fresh_dir("open-store");
  const auto out = sluice_test::fresh_dir("open-out");
  auto res = sluice_test::run_ranks(
      n,
      [&](std::size_t rank) {
        nlohmann::json j;
        try {
          const auto who = one_node(rank, n, store);
          comm::gloo c(who);
          j = body(rank, c);
        } catch (const std::exception& e) {
          j["error"] = describe(e);
        }
        sluice_test::write_rank_json(out, rank, j);
        return 0;
      },
      60s);
  auto results = sluice_test::read_rank_jsons(out, res);
  fs::remove_all(store);
  fs::remove_all(out);
  return results;
}

// Every tensor as (name, shard file, offset, size, dtype, shape).
nlohmann::json layout_of(const checkpoint& ck) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& t : ck.tensors())
    j.push_back({t.name, ck.shards()[t.shard].name, t.offset, t.size, std::string(format::name(t.type)), t.shape});
  return j;
}

// A copy of the test checkpoint that `spoil(dir)` may damage.
fs::path spoiled_copy(const std::string& tag, const std::function<void(const fs::path&)>& spoil) {
  const auto copy = sluice_test::fresh_dir(tag);
  for (auto& f : fs::directory_iterator(checkpoint_dir())) fs::copy_file(f.path(), copy / f.path().filename());
  spoil(copy);
  return copy;
}

}  // namespace

// The plan check is one all-gather of the schedule's digests: every rank
// reaches the same verdict from them. A rank whose options differ (here the
// status pace, which the digest covers) fails every rank before any read.
TEST_CASE("ranks whose plans differ all fail before any read, naming the rank that differs", "[comm][distributed]") {
  const auto results = run_collective(4, [](std::size_t rank, comm::gloo& c) {
    auto o = small_options();
    o.plan.local_size = 4;
    if (rank == 2) o.status_every = 0;  // another schedule: another digest
    const auto ck = checkpoint::open(checkpoint_dir());
    recording_sink s;
    (void)load_distributed(ck, c, plan_for(ck, "tp1,dp4,ep4", "none", o), s, o);
    return nlohmann::json{{"calls", s.calls.size()}};
  });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].dump());
    REQUIRE(results[r].contains("error"));
    REQUIRE_THAT(results[r]["error"]["what"].get<std::string>(),
                 Catch::Contains("rank 0 failed while comparing load plans: rank 2 computed a different load plan"));
    REQUIRE(results[r]["error"]["failed_rank"] == 0);
  }
}

TEST_CASE("4 ranks open a checkpoint collectively: rank 0 alone reads the headers, every rank gets the same checkpoint",
          "[comm][distributed][open]") {
  const auto single = checkpoint::open(checkpoint_dir());
  const auto ref = reference_digests();
  REQUIRE(single.header_bytes_read() > 0);
  const auto results = run_collective(4, [&](std::size_t, comm::gloo& c) {
    const auto ck = checkpoint::open(checkpoint_dir(), c);
    nlohmann::json j;
    j["layout"] = layout_of(ck);
    j["header_bytes_read"] = ck.header_bytes_read();
    j["storage_bytes_read"] = ck.storage().bytes_read();  // its own catalog: what this rank read
    j["location"] = ck.location();
    // Its own catalog reads the data: a plain load of it gives every tensor.
    digest_sink d;
    load_options lo;
    lo.register_buffers = false;
    (void)load(ck, d, lo);
    for (auto& [n, t] : d.digests()) j["digests"][n] = t.sha256;
    return j;
  });
  std::uint64_t opened = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 1500));
    REQUIRE(j["exit"] == 0);
    REQUIRE_FALSE(j.contains("error"));
    REQUIRE(j["layout"] == layout_of(single));
    REQUIRE(j["location"] == single.location());
    REQUIRE(j["digests"].size() == ref.size());
    for (auto& [n, sha] : j["digests"].items()) REQUIRE(sha.get<std::string>() == ref.at(n));
    REQUIRE(j["header_bytes_read"].get<std::uint64_t>() == (r == 0 ? single.header_bytes_read() : 0));
    opened += j["header_bytes_read"].get<std::uint64_t>();
  }
  REQUIRE(opened == single.header_bytes_read());  // one rank's worth over the world
}

TEST_CASE("a directory adopting another rank's view of a shard checks its own file's size", "[comm][distributed][open]") {
  const auto ck = checkpoint::open(checkpoint_dir());
  const auto& sh = ck.shards().front();
  const auto size = fs::file_size(checkpoint_dir() / sh.name);
  directory_catalog cat(checkpoint_dir());
  REQUIRE_NOTHROW(cat.adopt(sh.name, size, std::nullopt));
  try {
    cat.adopt(sh.name, size + 1, std::nullopt);
    FAIL("a differing size was adopted");
  } catch (const format_error& e) {
    REQUIRE(e.rule() == "stale-shard");
    REQUIRE_THAT(e.what(), Catch::Contains(sh.name));
  }
  REQUIRE(cat.bytes_read() == 0);  // a stat, no read
}

TEST_CASE("a rank whose selection needs shards rank 0 did not open reads their headers itself", "[comm][distributed][open]") {
  const auto full = checkpoint::open(checkpoint_dir());
  open_options layer0;
  layer0.select = [](std::string_view n) { return n.starts_with("model.layers.0."); };
  const auto part = checkpoint::open(checkpoint_dir(), layer0);
  REQUIRE(part.shards().size() < full.shards().size());
  const auto results = run_collective(2, [&](std::size_t rank, comm::gloo& c) {
    const auto ck = checkpoint::open(checkpoint_dir(), c, rank == 0 ? layer0 : open_options{});
    return nlohmann::json{{"layout", layout_of(ck)}, {"header_bytes_read", ck.header_bytes_read()}};
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r].dump().substr(0, 1500));
    REQUIRE_FALSE(results[r].contains("error"));
  }
  REQUIRE(results[0]["layout"] == layout_of(part));
  REQUIRE(results[0]["header_bytes_read"].get<std::uint64_t>() == part.header_bytes_read());
  REQUIRE(results[1]["layout"] == layout_of(full));
  // The index and rank 0's headers came from rank 0; the rest it read.
  REQUIRE(results[1]["header_bytes_read"].get<std::uint64_t>() == full.header_bytes_read() - part.header_bytes_read());
}

TEST_CASE("load_distributed from a path: the bytes read to open, summed over 4 ranks, are one rank's worth, and its start-up is timed",
          "[comm][distributed][open]") {
  const auto single = checkpoint::open(checkpoint_dir());
  const auto ref = reference_digests();
  const auto store = sluice_test::fresh_dir("open-tool-store");
  const auto out = sluice_test::fresh_dir("open-tool-out");
  auto res = sluice_test::run_ranks(
      4,
      [&](std::size_t rank) {
        comm::rank_info who;
        who.hostname = "127.0.0.1";  // every "node" of the test is this machine
        who.rank = rank, who.world_size = 4, who.local_rank = rank, who.local_size = 4;
        who.store_dir = store.string();
        who.timeout = 20s;
        recording_sink s;
        const auto st = load_distributed(checkpoint_dir(), "tp1,dp4,ep4", "shared-cooperative", who, s, small_options());
        nlohmann::json j;
        j["stats"] = st.to_json();
        for (auto& [name, d] : s.digests.digests()) j["digests"][name] = d.sha256;
        sluice_test::write_rank_json(out, rank, j);
        return 0;
      },
      60s);
  std::uint64_t opened = 0, read = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(res[r].code == 0);
    nlohmann::json j;
    std::ifstream(out / fmt::format("rank{}.json", r)) >> j;
    for (auto& [n, sha] : j["digests"].items()) REQUIRE(sha.get<std::string>() == ref.at(n));
    opened += j["stats"]["header_bytes_read"].get<std::uint64_t>();
    read += j["stats"]["bytes_read"].get<std::uint64_t>();
    // The start-up, reported on its own: joining the world, then opening and planning.
    CHECK(j["stats"]["seconds"]["join"].get<double>() > 0);
    CHECK(j["stats"]["seconds"]["open"].get<double>() > 0);
  }
  CHECK(read == single.tensor_bytes());
  REQUIRE(opened == single.header_bytes_read());
  fs::remove_all(store);
  fs::remove_all(out);
}

TEST_CASE("rank 0 fails to open: every rank throws, typed as rank 0's error where it is a format rule, at once",
          "[comm][distributed][open]") {
  const auto victim = checkpoint::open(checkpoint_dir()).shards().back().name;
  // Every rank opens `dir(rank)` collectively; returns what each threw.
  auto open_all = [&](const std::function<fs::path(std::size_t)>& dir) {
    return run_collective(4, [&](std::size_t rank, comm::gloo& c) {
      (void)checkpoint::open(dir(rank), c);
      return nlohmann::json{{"opened", true}};
    });
  };
  auto single_error = [](const fs::path& dir) {
    try {
      (void)checkpoint::open(dir);
    } catch (const std::exception& e) {
      return describe(e);
    }
    return nlohmann::json{};
  };

  SECTION("a corrupt header: the same format_error on every rank") {
    const auto copy = spoiled_copy("open-corrupt", [&](const fs::path& d) {
      std::fstream f(d / victim, std::ios::in | std::ios::out | std::ios::binary);
      const std::uint64_t huge = std::uint64_t{1} << 40;  // a header length past the end of the file
      f.write(reinterpret_cast<const char*>(&huge), sizeof huge);
    });
    const auto want = single_error(copy);
    REQUIRE(want["type"] == "format_error");
    const auto results = open_all([&](std::size_t) { return copy; });
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << results[r].dump());
      REQUIRE_FALSE(results[r]["timed_out"].get<bool>());
      REQUIRE(results[r]["error"]["type"] == "format_error");
      REQUIRE(results[r]["error"]["rule"] == want["rule"]);
      REQUIRE(results[r]["error"]["what"] == want["what"]);
      REQUIRE_THAT(results[r]["error"]["what"].get<std::string>(), Catch::Contains(victim));
    }
    fs::remove_all(copy);
  }
  SECTION("a shard the index names is missing: index_error missing-shard on every rank") {
    const auto copy = spoiled_copy("open-missing", [&](const fs::path& d) { fs::remove(d / victim); });
    const auto results = open_all([&](std::size_t) { return copy; });
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << results[r].dump());
      REQUIRE_FALSE(results[r]["timed_out"].get<bool>());
      REQUIRE(results[r]["error"]["type"] == "index_error");
      REQUIRE(results[r]["error"]["rule"] == "missing-shard");
      REQUIRE_THAT(results[r]["error"]["what"].get<std::string>(), Catch::Contains(victim));
    }
    fs::remove_all(copy);
  }
  SECTION("rank 0's storage fails: rank 0 throws its io_error, the others distributed_error naming rank 0 and it") {
    const auto gone = sluice_test::fresh_dir("open-gone");
    fs::remove(gone);
    const auto results = open_all([&](std::size_t rank) { return rank == 0 ? gone : checkpoint_dir(); });
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << results[r].dump());
      REQUIRE_FALSE(results[r]["timed_out"].get<bool>());
      REQUIRE(results[r]["error"]["type"] == (r == 0 ? "io_error" : "distributed_error"));
      if (r > 0) {
        REQUIRE(results[r]["error"]["failed_rank"] == 0);
        REQUIRE_THAT(results[r]["error"]["what"].get<std::string>(), Catch::Contains("rank 0 failed while opening the checkpoint"));
      }
      REQUIRE_THAT(results[r]["error"]["what"].get<std::string>(), Catch::Contains(gone.string()));
    }
  }
}

TEST_CASE("load_distributed: rank 0's corrupt header fails every rank with distributed_error naming rank 0 and the file",
          "[comm][distributed][open]") {
  const auto victim = checkpoint::open(checkpoint_dir()).shards().front().name;
  const auto copy = spoiled_copy("open-tool-corrupt", [&](const fs::path& d) {
    std::fstream f(d / victim, std::ios::in | std::ios::out | std::ios::binary);
    const std::uint64_t huge = std::uint64_t{1} << 40;
    f.write(reinterpret_cast<const char*>(&huge), sizeof huge);
  });
  require_every_rank_fails_opening("open-tool", [&](std::size_t) { return copy; }, "none", 0, victim);
  fs::remove_all(copy);
}
