// tests for <sluice/cuda/device_sink.hpp>: file -> pinned staging -> device.
#include <utility>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/cuda/device_sink.hpp>
#include <sluice/cuda/staging.hpp>
#include <sluice/distributed.hpp>
#include <sluice/load_file.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/cuda/device_buffer.hpp>
#include <sluice/testing/generator.hpp>

#include "device_or_skip.hpp"
#include "lane_checkpoint.hpp"

using namespace sluice;

namespace {
struct temp_checkpoint {
  std::filesystem::path dir;
  testing::checkpoint_layout plan;
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
void require_digests(const cuda::device_sink& s, const testing::checkpoint_layout& plan) {
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

TEST_CASE("a rank's device is its local rank modulo the visible devices", "[cuda][device]") {
  STATIC_REQUIRE(cuda::device_for_local_rank(0, 8) == 0);
  STATIC_REQUIRE(cuda::device_for_local_rank(5, 8) == 5);
  STATIC_REQUIRE(cuda::device_for_local_rank(9, 8) == 1);
  // Each rank sees its own GPU only (CUDA_VISIBLE_DEVICES per rank): device 0, whatever its local rank.
  STATIC_REQUIRE(cuda::device_for_local_rank(3, 1) == 0);
  STATIC_REQUIRE(cuda::device_for_local_rank(3, 0) == 0);  // no device: 0, and the first CUDA call says why
  STATIC_REQUIRE(cuda::device_for_local_rank(3, -1) == 0);
  const int n = cuda::device_count();
  CHECK(cuda::device_for_local_rank(7) == (n > 0 ? 7 % n : 0));
}

TEST_CASE("a distributed rank reserves only its device tensors, at the sizes of its parts", "[cuda][device_sink]") {
  testing::generator_options g;
  g.experts = 8, g.layers = 3, g.engram_rows = 4096, g.max_shard_bytes = 256u << 10;
  temp_checkpoint ck_files(g);
  auto ck = checkpoint::open(ck_files.dir);
  for (const char* offload : {"per-rank", "shared-cooperative"}) {
    distributed_options o;
    o.plan.local_size = 4;
    const auto plan = plan_for(ck, "tp2,dp2,ep4", offload, o);
    for (policy::rank_t r = 0; r < 4; ++r) {
      INFO(offload << " rank " << r);
      const auto res = cuda::device_sink::plan_reservation(plan, r, 256);
      std::set<std::string> want;
      std::size_t bytes = 0, whole = 0, tables = 0;
      for (const auto& e : plan.entries) {
        if (!e.owners.contains(r)) continue;
        if (e.owner_destination != policy::destination::device) {
          tables += 1;
          CHECK_FALSE(res.offsets.contains(e.info.name));  // host and shared tables take no device memory
          continue;
        }
        want.insert(e.info.name);
        const auto at = res.offsets.at(e.info.name);
        CHECK(at % 256 == 0);
        CHECK(at + plan.kept_bytes(e) <= res.bytes);
        bytes += (plan.kept_bytes(e) + 255) / 256 * 256;
        whole += e.info.size;
      }
      CHECK(tables > 0);
      CHECK(res.offsets.size() == want.size());
      CHECK(res.bytes == bytes);
      CHECK(res.bytes < whole);  // split tensors: parts, not whole tensors
      CHECK(res.bytes < ck.tensor_bytes());
    }
  }
}

TEST_CASE("the arena of a one-rank load pads each device tensor to 256 bytes", "[cuda][device_sink]") {
  // The NCCL lane test's checkpoint and plan (test_nccl_lane.cpp expects
  // sink.stats().allocated to be this reservation on a GPU).
  temp_checkpoint ck_files(sluice_test::lane_generator_options());
  auto ck = checkpoint::open(ck_files.dir);
  const auto plan = sluice_test::lane_plan(ck);
  std::uint64_t device_bytes = 0, padded = 0;
  for (const auto& e : plan.entries)
    if (e.owner_destination == policy::destination::device) {
      device_bytes += e.info.size;
      padded += (plan.kept_bytes(e) + 255) / 256 * 256;
    }
  REQUIRE(device_bytes > 0);
  const auto res = cuda::device_sink::plan_reservation(plan, 0);
  CHECK(res.bytes == padded);
  // Not a multiple of 256 everywhere: the padding is what this checks.
  CHECK(res.bytes > device_bytes);
}

TEST_CASE("without allocation a tensor with no destination is declined, a zero-size one too", "[cuda][device_sink]") {
  CHECK_FALSE(cuda::device_sink::takes(0, /*has_destination=*/false, /*allocate=*/false));
  CHECK_FALSE(cuda::device_sink::takes(1024, false, false));
  CHECK(cuda::device_sink::takes(0, true, false));
  CHECK(cuda::device_sink::takes(1024, true, false));
  CHECK(cuda::device_sink::takes(0, false, true));
  CHECK(cuda::device_sink::takes(1024, false, true));
}

namespace {
// A view of `bytes` as tensor `t` (a fake staging slot: `hold` owns a copy).
tensor_view view_of(const tensor_ref& t, std::span<const std::byte> bytes, view_kind kind = view_kind::bytes) {
  auto l = lease::allocate(bytes.size());
  std::memcpy(l.bytes().data(), bytes.data(), bytes.size());
  tensor_view v;
  v.tensor = &t;
  v.bytes = l.bytes();
  v.hold = std::move(l);
  v.kind = kind;
  return v;
}
}  // namespace

TEST_CASE("views whose home is host memory never reach device memory", "[cuda][device_sink]") {
  SLUICE_REQUIRE_DEVICE();
  tensor_ref dense, table, shared;
  dense.name = "dense", dense.size = 4096, dense.shape = {4096};
  table.name = "table", table.size = 8192, table.shape = {8192};
  shared.name = "shared", shared.size = 4096, shared.shape = {4096};
  std::vector<std::byte> bytes(8192);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 13 + 1);
  auto seg = memory::shared_host::create(3 * 4096);
  std::memcpy(seg.bytes().data() + 4096, bytes.data(), 4096);
  auto shared_view = [&] {
    tensor_view v;
    v.tensor = &shared, v.kind = view_kind::shared, v.host_destined = true;
    v.bytes = seg.bytes().subspan(4096, 4096);
    v.hold = lease(seg.keep(), seg.bytes());  // as the distributed driver gives it: the whole segment
    return v;
  };
  auto table_view = [&] {
    auto v = view_of(table, bytes);
    v.host_destined = true;  // a per-rank table
    return v;
  };
  std::vector<std::byte> out(8192);

  SECTION("kept on the host: copied there (per-rank), held (shared), registered once with map_shared") {
    cuda::device_sink s({.map_shared = true});
    REQUIRE(s.accept(view_of(dense, std::span(bytes).first(4096))));
    REQUIRE(s.accept(table_view()));
    REQUIRE(s.accept(shared_view()));
    s.finish();
    CHECK(s.stats().bytes == 4096);      // only the dense tensor went to the device
    CHECK(s.stats().allocated == 4096);  // and only it took device memory
    CHECK(s.stats().on_host == 2);
    CHECK(s.get("table").data == nullptr);
    CHECK(s.get("table").size == 8192);
    REQUIRE(s.host("table").size() == 8192);
    s.download("table", out);
    CHECK(out == bytes);
    CHECK(s.host("shared").data() == seg.bytes().data() + 4096);  // not a copy
    const auto d = s.get("shared");
    REQUIRE(d.data != nullptr);  // the segment's device address (mapped)
    std::vector<std::byte> back(4096);
    REQUIRE(cudaMemcpy(back.data(), d.data, back.size(), cudaMemcpyDefault) == cudaSuccess);
    CHECK(std::memcmp(back.data(), bytes.data(), 4096) == 0);
  }
  SECTION("declined, or forwarded to a host sink") {
    {
      cuda::device_sink s({.host = cuda::host_views::decline});
      CHECK_FALSE(s.accept(table_view()));
      CHECK(s.accept(shared_view()));  // shared views are never copied: the sink just holds them
      s.finish();
      CHECK(s.stats().bytes == 0);
      CHECK(s.stats().allocated == 0);
      CHECK(s.get("table").size == 0);
    }
    std::vector<std::string> forwarded;
    cuda::device_sink s({.host_sink = [&](tensor_view v) {
      forwarded.push_back(v.name());
      return v.name() == "table";
    }});
    CHECK(s.accept(table_view()));
    CHECK_FALSE(s.accept(shared_view()));  // the host sink's answer
    s.finish();
    CHECK(forwarded == std::vector<std::string>{"table", "shared"});
    CHECK(s.stats().bytes == 0);
    CHECK(s.stats().allocated == 0);
  }
}

TEST_CASE("a sink fed from another thread copies on its own device", "[cuda][device_sink]") {
  SLUICE_REQUIRE_DEVICE();
  // On a machine with several GPUs the sink uses the last one while the
  // feeding thread's current device is 0: without the sink making its
  // device current, the copy would fail (invalid resource handle) and a
  // context would appear on GPU 0. With one GPU this runs the same path.
  const int device = cuda::device_count() - 1;
  tensor_ref t;
  t.name = "t", t.size = 1 << 20, t.shape = {1 << 20};
  std::vector<std::byte> bytes(t.size);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 31 + 7);
  cuda::device_sink s({.device = device});
  int current = -1;
  std::string failure;
  std::thread worker([&] {
    try {  // no Catch2 assertions on this thread
      if (::cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice(0) failed");
      (void)s.accept(view_of(t, bytes));
      s.finish();
      if (::cudaGetDevice(&current) != cudaSuccess) throw std::runtime_error("cudaGetDevice failed");
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  worker.join();
  REQUIRE(failure.empty());
  CHECK(current == device);
  std::vector<std::byte> out(t.size);
  std::thread([&] { s.download("t", out); }).join();  // download too, from a thread that never chose a device
  CHECK(out == bytes);
}
