// tests for <sluice/cuda/device_sink.hpp>: file -> pinned staging -> device.
#include <utility>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/cuda/device_sink.hpp>
#include <sluice/cuda/staging.hpp>
#include <sluice/load_file.hpp>
#include <sluice/memory/device.hpp>
#include <sluice/testing/generator.hpp>

#include "device_or_skip.hpp"

using namespace sluice;

namespace {
struct temp_checkpoint {
  std::filesystem::path dir;
  testing::checkpoint_plan plan;
  explicit temp_checkpoint(testing::generator_options o = {}) {
    static int n = 0;
    dir = std::filesystem::temp_directory_path() / ("sluice-cuda-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(dir);
    plan = testing::write_checkpoint(dir, o);
  }
  ~temp_checkpoint() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// Every tensor copied back from the device and hashed, against the plan.
void require_digests(const cuda::device_sink& s, const testing::checkpoint_plan& plan) {
  std::size_t checked = 0;
  for (const auto& t : testing::expected_tensors(plan)) {
    const auto d = s.get(t.name);
    std::vector<std::byte> host(d.size);
    s.download(t.name, host);
    INFO(t.name);
    CHECK(testing::sha256().update(host).hex() == t.sha256);
    ++checked;
  }
  CHECK(checked == plan.tensors.size());
}
}  // namespace

TEST_CASE("device_sink is a sink that copies from staging (never a direct sink)", "[cuda][device_sink]") {
  STATIC_REQUIRE(sink<cuda::device_sink>);
  STATIC_REQUIRE_FALSE(direct_sink<cuda::device_sink>);
  STATIC_REQUIRE_FALSE(wants_whole_tensors<cuda::device_sink>());
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<cuda::device_sink>);
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<cuda::device_sink>);
}

TEST_CASE("without a driver a device sink cannot be made: cuda_error naming cudaSetDevice", "[cuda][device_sink]") {
  SLUICE_REQUIRE_NO_DEVICE();
  try {
    cuda::device_sink s({.device = 0});
    FAIL("device_sink constructed without a driver");
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice");
    CHECK(e.code() != cudaSuccess);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("device 0"));
  }
}

TEST_CASE("a checkpoint loads into device memory through pinned staging byte for byte", "[cuda][device_sink]") {
  SLUICE_REQUIRE_DEVICE();
  temp_checkpoint ck_files;
  auto ck = checkpoint::open(ck_files.dir);
  for (auto io : {sluice::io_mode::automatic, sluice::io_mode::buffered}) {
    INFO("io mode " << static_cast<int>(io));
    // Two small slots and poisoning on: a slot reused while a copy still
    // read it would put 0xDB bytes on the device, and the digests would differ.
    auto pool = cuda::make_pinned_pool({.budget = 2 * slot_size_for(64 << 10), .slot_size = slot_size_for(64 << 10),
                                        .poison = true});
    cuda::device_sink s({.streams = 3});
    if (io == sluice::io_mode::automatic) s.reserve(ck);
    load_options o;
    o.max_read = 64 << 10;
    o.io = io;
    o.poison = true;
    const auto st = load(ck, s, pool, o);
    CHECK(st.tensors == ck.tensors().size());
    CHECK(st.accepted == st.tensors);
    CHECK(s.pending() == 0);
    CHECK(pool.free_count() == pool.slot_count());  // every slot came back
    CHECK(s.stats().bytes == ck.tensor_bytes());
    require_digests(s, ck_files.plan);
  }
}

TEST_CASE("caller destinations are filled in place and without allocation other tensors are declined", "[cuda][device_sink]") {
  SLUICE_REQUIRE_DEVICE();
  temp_checkpoint ck_files;
  auto ck = checkpoint::open(ck_files.dir);
  const auto& first = ck.tensors().front();
  auto buf = memory::device_buffer::allocate(first.size, 0, first.name);
  cuda::device_sink s({.allocate = false});
  s.set_destination(first.name, {buf.data(), buf.size()});
  auto pool = cuda::make_pinned_pool({.budget = 4 << 20, .slot_size = slot_size_for(1 << 20)});
  const auto st = load(ck, s, pool, {});
  CHECK(st.accepted == 1);
  CHECK(s.get(first.name).data == buf.data());
  std::vector<std::byte> host(first.size);
  s.download(first.name, host);
  for (const auto& t : testing::expected_tensors(ck_files.plan))
    if (t.name == first.name) CHECK(testing::sha256().update(host).hex() == t.sha256);
}

TEST_CASE("a wrong-sized caller destination is a config_error naming the tensor", "[cuda][device_sink]") {
  SLUICE_REQUIRE_DEVICE();
  temp_checkpoint ck_files;
  auto ck = checkpoint::open(ck_files.dir);
  const auto& first = ck.tensors().front();
  auto buf = memory::device_buffer::allocate(first.size + 1, 0);
  cuda::device_sink s;
  s.set_destination(first.name, {buf.data(), buf.size()});
  try {
    (void)load(ck, s, {});
    FAIL("loaded into a wrong-sized destination");
  } catch (const config_error& e) {
    CHECK(e.tensor() == first.name);
  }
}
