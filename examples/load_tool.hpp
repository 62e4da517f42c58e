// sluice-load's options and the parts of the tool in units of their own, so
// that no unit compiles all of it: load_args.cpp (the command line, CLI11)
// and load_distributed.cpp (the distributed load, the checkpoint's location
// with its S3 catalog, the NCCL lane).
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/load.hpp>
#include <sluice/location.hpp>
#include <sluice/policy/schedule.hpp>
#include <sluice/sink/digest_sink.hpp>

namespace sluice_load {

struct options {
  std::string source;
  sluice::load_options load;
  std::string select, index_file, json_out, contract_out, topology, offload = "none", overlap = "auto", uneven = "error",
              experts = "linear";
  std::optional<std::size_t> rank, world, local_rank, local_world;
  std::size_t connections_per_rank = 0;
  std::size_t connections = 0;  // 0: the S3 config's default
  std::string cache_dir;        // --cache (else SLUICE_CACHE_DIR)
  std::uint64_t cache_max = 0;  // --cache-max (else SLUICE_CACHE_MAX)
  bool digest = false, json = false, progress = true, probe = false, device = false;
  bool exchange_all = false;  // --exchange-all: distributed_options::page_cache off
  bool keep = false;          // --keep: hold every tensor until the load ends
  std::uint64_t status_every = sluice::policy::default_status_every;  // --status-every
  std::uint64_t window_bytes = 0;  // --window (0: the plan's default)
  std::optional<std::uint64_t> pieces_above;  // --pieces-above (else distributed_options' default)
};

// Digests of what this rank holds: placeholders (tensors it does not own) are skipped.
struct owned_digests {
  sluice::digest_sink d;
  bool accept(sluice::tensor_view v) { return v.carries_data() ? d.accept(std::move(v)) : false; }
};

// --keep: holds every tensor this rank owns until the end (what an engine
// holding its weights costs the node's memory): its view's lease where it
// has one (window buffers, page-cache views, the shared segment), else a copy.
struct keeping_sink {
  owned_digests* digests = nullptr;  // --digest too
  std::vector<sluice::lease> held;
  bool accept(sluice::tensor_view v) {
    if (!v.carries_data()) return false;
    if (v.hold) {
      held.push_back(v.hold);
    } else {
      auto copy = sluice::lease::allocate(v.bytes.size());
      std::memcpy(copy.bytes().data(), v.bytes.data(), v.bytes.size());
      held.push_back(std::move(copy));
    }
    return digests ? digests->accept(std::move(v)) : true;
  }
};

// Fills `o` from the command line; an exit code when the tool stops there
// (--help, or a usage error already reported on stderr).
std::optional<int> parse(options& o, int argc, char** argv);

// The checkpoint's location: a path, or an S3 URI whose catalog (and its
// config, from the environment) is made only when the location is opened.
sluice::location where_of(const options& o);

// What the node-local cache did in this process ("" without one): bytes
// served, fetched, fetched again (headers included), and XXH3's time per
// GiB; and the same as JSON.
std::string cache_summary();
nlohmann::ordered_json cache_json();
// For the progress line: "  cache: X from it, Y from S3" while a cache is in use ("" without one).
std::string cache_progress();

// --select (a regular expression over tensor names) and --index.
sluice::open_options open_options_of(const options& o);

// A distributed load of this rank (--world, or torchrun's environment), with
// its summary; the tool's exit code.
int run_distributed(const options& o);

}  // namespace sluice_load
