#pragma once
// The small distributed load the failure tests share (test_failure_cleanup.cpp,
// test_dead_peer.cpp): a generated checkpoint with shared tables (so the load
// has a table phase and makes a segment) and many small windows, so that a
// failure lands mid-load.
#include <filesystem>
#include <string>
#include <utility>

#include <sluice/distributed.hpp>
#include <sluice/testing/generator.hpp>

#include "comm/multiprocess.hpp"

namespace sluice_test {

/// Writes the checkpoint into a fresh directory named after `tag`, removed at the test process's exit.
inline std::filesystem::path write_small_checkpoint(const std::string& tag) {
  sluice::testing::generator_options o;
  o.experts = 8;
  o.layers = 3;
  o.engram_rows = 4096;  // shared tables: a table phase and a segment
  o.max_shard_bytes = 128u << 10;
  auto d = process_dir(tag);
  sluice::testing::write_checkpoint(d, o);
  return d;
}

/// Small staging and windows: several windows per load.
inline sluice::distributed_options small_options(std::string segment_name) {
  sluice::distributed_options o;
  o.load.staging_budget = 8u << 20;
  o.load.max_read = 1u << 20;
  o.load.register_buffers = false;
  o.plan.window_bytes = 96u << 10;
  o.plan.split_bytes = 64u << 10;
  o.segment_name = std::move(segment_name);
  return o;
}

}  // namespace sluice_test
