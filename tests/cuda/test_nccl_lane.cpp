// tests for <sluice/nccl/lane.hpp>: the device lane of a distributed load.
// One GPU per machine here, and NCCL refuses two ranks on one device, so the
// device test is a one-rank world: reads -> pinned host -> upload -> (an empty
// NCCL exchange) -> device views -> cuda::device_sink device-to-device. The
// multi-rank logic of the lane (layouts, messages, uploads ordered before the
// exchange) is the driver's, tested without a GPU through
// testing::emulated_device_lane in tests/comm/test_distributed.cpp.
#include <utility>

#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/comm/local.hpp>
#include <sluice/nccl/lane.hpp>
#include <sluice/cuda/device_sink.hpp>
#include <sluice/distributed.hpp>
#include <sluice/cuda/pinned.hpp>
#include <sluice/testing/generator.hpp>

#include "device_or_skip.hpp"
#include "lane_checkpoint.hpp"

using namespace sluice;

TEST_CASE("nccl_lane is a device lane", "[cuda][nccl][lane]") {
  STATIC_REQUIRE(device_lane<comm::nccl_lane>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<comm::nccl_lane>);
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<comm::nccl_lane>);
}

TEST_CASE("a one-rank distributed load through the NCCL lane lands every tensor on the device", "[cuda][nccl][lane]") {
  SLUICE_REQUIRE_DEVICE();
  const auto dir = std::filesystem::temp_directory_path() / ("sluice-nccl-lane-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto written = testing::write_checkpoint(dir, sluice_test::lane_generator_options());
  {
    auto ck = checkpoint::open(dir);
    const auto o = sluice_test::lane_distributed_options();
    const auto plan = sluice_test::lane_plan(ck);
    comm::local host;
    auto dev = comm::nccl::connect(host, {.device = 0});
    comm::nccl_lane lane(dev);
    cuda::device_sink sink({.device = 0});
    const auto st = load_distributed(ck, host, plan, sink, o, lane);

    std::uint64_t device_bytes = 0, device_tensors = 0;
    for (const auto& e : plan.entries)
      if (e.owner_destination == policy::destination::device) device_bytes += e.info.size, device_tensors += 1;
    REQUIRE(device_tensors > 0);
    REQUIRE(st.device_views == device_tensors);
    REQUIRE(st.bytes_uploaded == device_bytes);
    REQUIRE(lane.stats().uploaded_bytes == device_bytes);
    REQUIRE(lane.stats().exchanges == plan.windows);
    REQUIRE(st.windows > 2);
    // The per-rank tables stay in host memory: the sink copies only the
    // device views, and takes device memory only for them: the arena
    // load_distributed reserves from the plan, each tensor padded to the
    // sink's alignment (256 bytes), so more than device_bytes (checked
    // without a GPU in test_device_sink.cpp).
    REQUIRE(sink.stats().bytes == device_bytes);
    REQUIRE(sink.stats().allocated == cuda::device_sink::plan_reservation(plan, 0).bytes);
    REQUIRE(sink.stats().on_host == ck.tensors().size() - device_tensors);
    // Every tensor (device views copied device-to-device, host tables from
    // the sink's host copies) copied back and hashed against the generator.
    std::size_t checked = 0;
    for (const auto& t : testing::expected_tensors(written)) {
      std::vector<std::byte> out(sink.get(t.name).size);
      sink.download(t.name, out);
      INFO(t.name);
      CHECK(testing::sha256().update(out).hex() == t.sha256);
      ++checked;
    }
    REQUIRE(checked == ck.tensors().size());
    lane.release();  // bounded: the communicator is healthy, the stream idle
    CHECK_FALSE(dev.aborted());
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a device buffer a sink held comes back to the lane instead of going to cudaFree", "[cuda][nccl][lane]") {
  SLUICE_REQUIRE_DEVICE();
  comm::local host;
  auto dev = comm::nccl::connect(host, {.device = 0});
  comm::nccl_lane lane(dev);
  auto a = lane.device_buffer(0, 1 << 20);
  const auto* first = a.bytes().data();
  auto b = lane.device_buffer(0, 1 << 20);  // `a` is held (a sink's view): a second buffer
  CHECK(b.bytes().data() != first);
  CHECK(lane.stats().device_allocations == 2);
  a = {};                                   // the sink lets go of the first
  auto c = lane.device_buffer(0, 1 << 20);  // `b` is held: the first comes back, no cudaMalloc
  CHECK(c.bytes().data() == first);
  CHECK(lane.stats().device_allocations == 2);
  CHECK(lane.stats().device_recycled == 1);
  lane.release();  // frees the free list; `b` and `c` go when let go
  b = {};
  c = {};
  CHECK_FALSE(dev.aborted());
}
