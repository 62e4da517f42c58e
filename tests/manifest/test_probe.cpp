// Tests of include/sluice/probe.hpp: metadata-only runs through a sink, the
// plan and the contract from shard headers alone.

#include <utility>

#include <algorithm>
#include <sstream>

#include <catch2/catch.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/load_file.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/probe.hpp>
#include <sluice/source/directory_catalog.hpp>

#include "model_fixture.hpp"

using namespace sluice;
using namespace manifest_test;

namespace {

/// Records what it is offered; declines tensors named "*.norm.weight".
struct watching_sink {
  std::vector<const tensor_ref*> seen;
  bool all_metadata = true;
  bool finished = false;
  bool accept(tensor_view v) {
    all_metadata = all_metadata && v.kind == view_kind::metadata && v.bytes.empty() && !v.hold && v.offset == 0 &&
                   v.whole() && v.last();
    seen.push_back(v.tensor);
    return !v.name().ends_with("norm.weight");
  }
  void finish() { finished = true; }
};

}  // namespace

TEST_CASE("a probe offers every tensor as a metadata-only view, in file order", "[manifest][probe]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  watching_sink s;
  const auto r = probe(ck, s);
  REQUIRE(s.seen.size() == ck.tensors().size());
  for (std::size_t i = 0; i < s.seen.size(); ++i) CHECK(s.seen[i] == &ck.tensors()[i]);
  CHECK(s.all_metadata);
  CHECK(s.finished);
  CHECK(r.seen == s.seen);
  CHECK(r.accepted_count() == ck.tensors().size() - n_layers - 1);
  CHECK(r.bytes_read == 0);
  CHECK(r.tensor_bytes == ck.tensor_bytes() - (n_layers + 1) * hidden);
}

TEST_CASE("a probe reads headers only and writes nothing", "[manifest][probe]") {
  temp_dir dir;
  write_model(dir.path());
  directory_catalog cat(dir.path());
  const auto ck = checkpoint::open(cat);
  const auto after_open = cat.bytes_read();
  CHECK(after_open == ck.header_bytes_read());
  CHECK(after_open < std::filesystem::file_size(dir.path() / "model.safetensors") - ck.tensor_bytes() + 1);

  engine e;
  const auto buffers_before = e.buffers;
  const auto rep = probe_contract(ck, engine_loader{&e});
  CHECK(cat.bytes_read() == after_open);  // the catalog's counters: nothing beyond the headers
  CHECK(rep.result.bytes_read == 0);
  CHECK(rep.plan.bytes_read == 0);
  CHECK(rep.plan.header_bytes_read == ck.header_bytes_read());
  CHECK(rep.plan.to_json().at("bytes_read") == 0);
  CHECK(e.writes.empty());                 // writes suppressed
  CHECK(e.buffers == buffers_before);
  CHECK(rep.contract.size() == 3 + n_layers * (3 + n_experts + 1));
}

TEST_CASE("the probe's contract is the one the initial load records", "[manifest][probe]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  engine probed;
  probed.ep_rank = 1;
  probed.ep_size = 2;
  const auto rep = probe_contract(ck, engine_loader{&probed});

  engine loaded;
  loaded.ep_rank = 1;
  loaded.ep_size = 2;
  manifest::recorder rec(engine_loader{&loaded});
  load(ck, rec);
  CHECK(rec.freeze() == rep.contract);
  CHECK(rep.plan.accepted == ck.tensors().size() - n_layers * n_experts / 2);
}

TEST_CASE("the plan lists keys and bytes per layer and prints one line per layer", "[manifest][probe]") {
  temp_dir dir;
  write_model(dir.path());
  const auto ck = checkpoint::open(dir.path());
  const auto rep = probe_contract(ck);  // accept_all: one application per tensor
  REQUIRE(rep.plan.layers.size() == n_layers + 1);
  CHECK(rep.plan.layers[0].layer == manifest::non_layer);
  CHECK(rep.plan.layers[0].keys == 3);
  CHECK(rep.plan.layers[0].bytes == 2 * vocab * hidden + hidden);
  CHECK(rep.plan.layers[1].layer == 0);
  CHECK(rep.plan.layers[1].keys == 3 + n_experts + 1);
  CHECK(rep.plan.layers[1].tensors == 3 + n_experts + 1);
  CHECK(rep.plan.layers[1].bytes == (3 + n_experts) * hidden * hidden + hidden);
  CHECK(rep.plan.keys == ck.tensors().size());
  CHECK(rep.plan.bytes == ck.tensor_bytes());
  for (const auto& t : ck.tensors()) CHECK(rep.contract.contains({t.name, t.name, {}}));

  std::ostringstream os;
  print_probe_plan(os, rep.plan);
  const auto out = os.str();
  INFO(out);
  CHECK(std::count(out.begin(), out.end(), '\n') == n_layers + 3);  // heading, layers, total
  CHECK(out.find("non-layer") != std::string::npos);
  CHECK(out.find("tensor bytes read 0") != std::string::npos);

  manifest::save(rep.contract, dir.path() / "c.json");
  CHECK(manifest::load_contract(dir.path() / "c.json") == rep.contract);
}
