#pragma once
// The checkpoint and plan of the one-rank NCCL lane test (test_nccl_lane.cpp),
// shared with the CPU test of the arena it makes (test_device_sink.cpp): what
// the lane test expects of the sink on a GPU is checked here without one.
#include <sluice/distributed.hpp>
#include <sluice/testing/generator.hpp>

namespace sluice_test {

inline sluice::testing::generator_options lane_generator_options() {
  sluice::testing::generator_options g;
  g.experts = 8, g.layers = 3, g.engram_rows = 4096, g.max_shard_bytes = 1u << 20;
  return g;
}

inline sluice::distributed_options lane_distributed_options() {
  sluice::distributed_options o;
  o.load.register_buffers = false;
  o.plan.window_bytes = 256u << 10;  // several windows: buffers reused and replaced
  o.plan.split_bytes = 64u << 10;
  return o;
}

inline sluice::policy::load_plan lane_plan(const sluice::checkpoint& ck) {
  return sluice::plan_for(ck, "tp1,dp1,ep1", "per-rank", lane_distributed_options());
}

}  // namespace sluice_test
