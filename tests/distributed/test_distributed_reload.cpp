// Reload under distribution, end to end: 8 forked ranks, TP1/DP8/EP8, the
// node's shared tables (cooperative offload) and placeholders. Each rank
// records its load contract during the distributed initial load with an
// engine-like loader that declines the routed experts it does not own, then
// reloads an updated checkpoint (the generator's seed 2) through its own
// manifest::reload_session, and a testing::reload_meter checks, view by view,
// that what the session buffers stays within the rank's share of the layers
// still incomplete.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/distributed.hpp>
#include <sluice/gloo/communicator.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/manifest/reload.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/testing/generator.hpp>
#include <sluice/testing/reload_meter.hpp>

#include "../comm/multiprocess.hpp"
#include "../comm/rank_json.hpp"

using namespace sluice;
using namespace sluice::manifest;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t world = 8;
constexpr std::uint32_t experts = 8;  // EP 8: one routed expert per rank and layer
constexpr const char* topology = "tp1,dp8,ep8";
constexpr const char* offload = "shared-cooperative";

testing::generator_options model(std::uint64_t seed) {
  testing::generator_options o;
  o.experts = experts;
  o.layers = 3;
  o.engram_rows = 4096;  // 2 shared tables of 512 KiB + scales
  o.max_shard_bytes = 128u << 10;
  o.seed = seed;
  return o;
}

const fs::path& checkpoint_dir(std::uint64_t seed) {
  static std::map<std::uint64_t, fs::path> dirs;
  auto& d = dirs[seed];
  if (d.empty()) {
    d = sluice_test::process_dir("dist-reload-ckpt");
    testing::write_checkpoint(d, model(seed));
  }
  return d;
}
const fs::path& initial_dir() { return checkpoint_dir(1); }
const fs::path& update_dir() { return checkpoint_dir(2); }

distributed_options options() {
  distributed_options o;
  o.load.staging_budget = 8u << 20;
  o.load.max_read = 1u << 20;
  o.load.register_buffers = false;
  o.plan.window_bytes = 96u << 10;  // many windows
  o.plan.split_bytes = 64u << 10;   // and tensors read in slices
  o.plan.local_size = world;
  return o;
}

std::optional<std::int64_t> expert_of(const std::string& name) {
  static const std::regex re(R"(\.mlp\.experts\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, re)) return std::nullopt;
  return std::stoll(m[1].str());
}

// What one rank's engine holds: the sha256 of the bytes last applied per tensor.
struct engine {
  std::size_t rank = 0;
  std::map<std::string, std::string> weights;
  std::set<std::string> shared;  ///< tensors applied from a shared view (the node's one copy)
};

// The engine's loader, bool(view, log): declines the routed experts of the
// other EP ranks (expert e lives on EP rank e * EP / experts, as the plan
// places it); writes only views that carry bytes (a probe's view: record only).
struct ep_loader {
  engine* e;
  bool operator()(tensor_view v, application_log& log) {
    const auto x = expert_of(v.name());
    if (x && static_cast<std::size_t>(*x) * world / experts != e->rank) return false;
    if (v.carries_data()) {
      if (v.kind == view_kind::shared) e->shared.insert(v.name());
      digest_sink d;
      d.accept(v);
      e->weights[v.name()] = d.digests().at(v.name()).sha256;
    }
    selectors sel;
    if (x) sel.emplace("expert_id", *x);
    log.record(v.name(), std::move(sel));
    return true;
  }
};

// A loader that cannot decline: applies every tensor it is given.
struct void_loader {
  engine* e;
  void operator()(tensor_view v) {
    if (!v.carries_data()) return;
    digest_sink d;
    d.accept(v);
    e->weights[v.name()] = d.digests().at(v.name()).sha256;
  }
};

struct publish_log {
  std::vector<std::int64_t>* published;
  void operator()(const layer_contract& lc) const { published->push_back(lc.layer); }
};

comm::rank_info rank_info_for(std::size_t rank, const fs::path& store) {
  comm::rank_info who;
  who.hostname = "127.0.0.1";  // every "node" of the test is this machine
  who.rank = rank, who.world_size = world, who.local_rank = rank, who.local_size = world;
  who.store_dir = store.string();
  who.timeout = 30s;
  return who;
}

// The tensors the plan gives `rank` (its experts, every replicated tensor, the shared tables).
std::set<std::string> owned_by(const policy::load_plan& plan, std::size_t rank) {
  std::set<std::string> s;
  for (const auto& e : plan.entries)
    if (e.owners.contains(static_cast<policy::rank_t>(rank))) s.insert(e.info.name);
  return s;
}

nlohmann::json names(const std::set<std::string>& s) { return nlohmann::json(std::vector<std::string>(s.begin(), s.end())); }

// The reload's figures and outcome on one rank.
template <class Session, class Meter>
nlohmann::json reload_report(const Session& s, const Meter& m, const std::vector<std::int64_t>& published) {
  return {{"published", published.size()},
          {"layers", s.expected().layers().size()},
          {"incomplete", s.last_incomplete().size()},
          {"warnings", s.warnings()},
          {"declined", s.stats().declined},
          {"buffered_after", s.stats().buffered_bytes},
          {"peak", s.stats().peak_buffered_bytes},
          {"seen_peak", m.seen_peak()},
          {"share_at_peak", m.share_at_peak()},
          {"max_share", m.max_share()},
          {"max_excess", m.max_excess()},
          {"contract_bytes", m.contract_bytes()}};
}

// Tensors of `ck` the plan gives `rank` whose engine bytes are not the update's.
std::vector<std::string> stale(const engine& e, const checkpoint& ck, const policy::load_plan& plan, std::uint64_t seed) {
  std::vector<std::string> out;
  for (const auto& name : owned_by(plan, e.rank)) {
    const auto it = e.weights.find(name);
    if (it == e.weights.end() || it->second != testing::tensor_sha256(seed, name, ck.find(name)->size)) out.push_back(name);
  }
  return out;
}

// Runs `body` as the 8 ranks; each returns its JSON (an exception becomes {"error": what}).
std::vector<nlohmann::json> run(const std::function<nlohmann::json(std::size_t, comm::gloo&)>& body) {
  (void)initial_dir(), (void)update_dir();  // written once, before the fork
  const auto store = sluice_test::fresh_dir("dist-reload-store");
  const auto out = sluice_test::fresh_dir("dist-reload-out");
  const auto res = sluice_test::run_ranks(
      world,
      [&](std::size_t rank) {
        nlohmann::json j;
        int code = 0;
        try {
          comm::gloo c(rank_info_for(rank, store));
          j = body(rank, c);
        } catch (const std::exception& e) {
          j["error"] = e.what();
          code = 3;
        }
        sluice_test::write_rank_json(out, rank, j);
        return code;
      },
      180s);
  auto results = sluice_test::read_rank_jsons(out, res);
  fs::remove_all(store);
  fs::remove_all(out);
  return results;
}

}  // namespace

TEST_CASE("8 ranks TP1/DP8/EP8: a contract recorded in the distributed load, then a distributed reload publishes every layer",
          "[distributed][reload]") {
  const auto results = run([](std::size_t rank, comm::gloo& c) {
    nlohmann::json j;
    const auto o = options();
    const auto ck = checkpoint::open(initial_dir());
    const auto plan = plan_for(ck, topology, offload, o);
    engine eng{rank, {}};

    // The initial load, recorded: placeholders for the other ranks' experts,
    // shared views of the node's tables, bytes for the rest.
    recorder rec(ep_loader{&eng});
    const auto st0 = load_distributed(ck, c, plan, rec, o);
    const auto contract = rec.freeze();
    std::set<std::string> sources;
    for (const auto& [l, lc] : contract.layers())
      for (const auto& s : lc.sources()) sources.insert(s);
    j["initial"] = {{"placeholders", st0.placeholders}, {"shared_views", st0.shared_views}};
    j["contract_sources"] = names(sources);
    j["owned"] = names(owned_by(plan, rank));

    // The distributed reload of the update, through this rank's session.
    const auto up = checkpoint::open(update_dir());
    const auto plan2 = plan_for(up, topology, offload, o);
    std::vector<std::int64_t> published;
    std::vector<std::string> warnings;
    reload_session s(contract, ep_loader{&eng}, publish_log{&published},
                     reload_options{[&warnings](const std::string& w) { warnings.push_back(w); }});
    testing::reload_meter meter(s);
    eng.shared.clear();
    const auto st1 = load_distributed(up, c, plan2, meter, o);
    j["reload"] = reload_report(s, meter, published);
    // The tables were published as views of the node's segment, not copies.
    std::set<std::string> tables;
    for (const auto& e : plan2.entries)
      if (e.shared()) tables.insert(e.info.name);
    j["tables"] = names(tables);
    j["reload"]["shared"] = names(eng.shared);
    j["reload"]["placeholders"] = st1.placeholders;
    j["reload"]["stale"] = stale(eng, up, plan2, 2);

    // The same update offered whole to this rank (every expert, as a trainer
    // that sends every tensor to every rank would): the experts it declines
    // are never buffered.
    std::vector<std::int64_t> published2;
    reload_session s2(contract, ep_loader{&eng}, publish_log{&published2},
                      reload_options{[&warnings](const std::string& w) { warnings.push_back(w); }});
    testing::reload_meter meter2(s2);
    load_options lo = o.load;
    lo.max_read = 64u << 10;  // tensors in pieces
    (void)load(up, meter2, lo);
    j["whole"] = reload_report(s2, meter2, published2);
    return j;
  });
  std::uint64_t declined = 0;
  for (std::size_t r = 0; r < world; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 3000));
    REQUIRE(j["exit"] == 0);
    // The contract holds exactly what the plan gives the rank: no placeholder.
    CHECK(j["initial"]["placeholders"].get<std::uint64_t>() > 0);
    CHECK(j["initial"]["shared_views"].get<std::uint64_t>() > 0);
    CHECK(j["contract_sources"] == j["owned"]);
    for (const char* which : {"reload", "whole"}) {
      INFO(which);
      const auto& x = j[which];
      // Every layer published, nothing missing, nothing left buffered.
      CHECK(x["published"] == x["layers"]);
      CHECK(x["incomplete"] == 0);
      CHECK(x["warnings"].empty());
      CHECK(x["buffered_after"] == 0);
      // The bound, on byte counts: never more than this rank's share of the
      // layers still incomplete (the meter checks it at every view).
      CHECK(x["max_excess"] == 0);
      CHECK(x["seen_peak"] == x["peak"]);
      CHECK(x["peak"].get<std::uint64_t>() <= x["share_at_peak"].get<std::uint64_t>());
      CHECK(x["peak"].get<std::uint64_t>() > 0);
    }
    // Distributed: the other ranks' experts came as placeholders (nothing
    // to decline); the new bytes reached every tensor the rank owns.
    CHECK(j["reload"]["placeholders"] == j["initial"]["placeholders"]);
    CHECK(j["reload"]["declined"] == 0);
    CHECK(j["reload"]["stale"].empty());
    CHECK_FALSE(j["tables"].empty());
    CHECK(j["reload"]["shared"] == j["tables"]);
    declined += j["whole"]["declined"].get<std::uint64_t>();
  }
  // Offered whole, each rank declined every expert tensor but its own, on arrival.
  const auto up = checkpoint::open(update_dir());
  std::uint64_t expert_tensors = 0;
  for (const auto& t : up.tensors()) expert_tensors += expert_of(t.name) ? 1 : 0;
  CHECK(declined == expert_tensors * (world - 1));
}

TEST_CASE("8 ranks: a loader that cannot decline records no placeholder, and its distributed reload completes",
          "[distributed][reload]") {
  const auto results = run([](std::size_t rank, comm::gloo& c) {
    nlohmann::json j;
    const auto o = options();
    const auto ck = checkpoint::open(initial_dir());
    const auto plan = plan_for(ck, topology, offload, o);
    engine eng{rank, {}};
    recorder rec(void_loader{&eng});
    static_assert(!decltype(rec)::can_decline);
    (void)load_distributed(ck, c, plan, rec, o);
    const auto contract = rec.freeze();
    std::set<std::string> sources;
    for (const auto& [l, lc] : contract.layers())
      for (const auto& s : lc.sources()) sources.insert(s);
    j["contract_sources"] = names(sources);
    j["owned"] = names(owned_by(plan, rank));

    const auto up = checkpoint::open(update_dir());
    const auto plan2 = plan_for(up, topology, offload, o);
    std::vector<std::int64_t> published;
    reload_session s(contract, void_loader{&eng}, publish_log{&published});
    testing::reload_meter meter(s);
    (void)load_distributed(up, c, plan2, meter, o);
    j["reload"] = reload_report(s, meter, published);
    j["reload"]["stale"] = stale(eng, up, plan2, 2);
    return j;
  });
  for (std::size_t r = 0; r < world; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 3000));
    REQUIRE(j["exit"] == 0);
    CHECK(j["contract_sources"] == j["owned"]);
    CHECK(j["reload"]["published"] == j["reload"]["layers"]);
    CHECK(j["reload"]["incomplete"] == 0);
    CHECK(j["reload"]["max_excess"] == 0);
    CHECK(j["reload"]["stale"].empty());
  }
}

TEST_CASE("8 ranks: a distributed reload missing a key fails on every rank, naming it", "[distributed][reload]") {
  // Expert 3 of layer 1 lives on rank 3 alone: only its contract names it.
  const std::string dropped = "model.layers.1.mlp.experts.3.down_proj.weight";
  REQUIRE(checkpoint::open(update_dir()).find(dropped) != nullptr);
  const auto results = run([&dropped](std::size_t rank, comm::gloo& c) {
    nlohmann::json j;
    const auto o = options();
    const auto ck = checkpoint::open(initial_dir());
    engine eng{rank, {}};
    recorder rec(ep_loader{&eng});
    (void)load_distributed(ck, c, plan_for(ck, topology, offload, o), rec, o);
    const auto contract = rec.freeze();
    j["names_dropped"] = !contract.keys_of_source(dropped).empty();

    const auto up = checkpoint::open(update_dir(), {.select = [&dropped](std::string_view n) { return n != dropped; }});
    std::vector<std::int64_t> published;
    reload_session s(contract, ep_loader{&eng}, publish_log{&published}, reload_options{[](const std::string&) {}});
    try {
      (void)load_distributed(up, c, plan_for(up, topology, offload, o), s, o);
      j["threw"] = false;
    } catch (const distributed_error& e) {
      j["threw"] = true;
      j["error"] = e.what();
      j["failed_rank"] = e.failed_rank();
    }
    j["published"] = published.size();
    j["layers"] = contract.layers().size();
    return j;
  });
  for (std::size_t r = 0; r < world; ++r) {
    const auto& j = results[r];
    INFO("rank " << r << ": " << j.dump().substr(0, 3000));
    REQUIRE(j["exit"] == 0);
    CHECK(j["names_dropped"] == (r == 3));
    REQUIRE(j["threw"] == true);
    CHECK(j["failed_rank"] == 3);
    const auto msg = j["error"].get<std::string>();
    CHECK_THAT(msg, Catch::Contains("rank 3"));
    CHECK_THAT(msg, Catch::Contains(dropped));
    CHECK_THAT(msg, Catch::Contains("layer 1"));
    // Only the layer that lacks the key stays unpublished, and only on rank 3.
    CHECK(j["published"].get<std::size_t>() == j["layers"].get<std::size_t>() - (r == 3 ? 1 : 0));
  }
}
