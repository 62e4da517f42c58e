// tests for <sluice/nccl/communicator.hpp>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/comm/local.hpp>
#include <sluice/nccl/communicator.hpp>
#include <sluice/cuda/error.hpp>
#include <sluice/cuda/device_buffer.hpp>

#include "device_or_skip.hpp"
#include "support/redis_server.hpp"

using namespace sluice;

namespace {
bool all_zero(const comm::nccl::unique_id& id) {
  for (auto b : id)
    if (b != std::byte{0}) return false;
  return true;
}
struct temp_store {
  std::filesystem::path dir;
  temp_store() {
    static int n = 0;
    dir = std::filesystem::temp_directory_path() / ("sluice-nccl-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(dir);
    comm::make_private_dir(dir.string());  // 0700: the rendezvous refuses a store others can read
  }
  ~temp_store() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
}  // namespace

TEST_CASE("nccl is a communicator (over device spans)", "[cuda][nccl]") {
  STATIC_REQUIRE(comm::communicator<comm::nccl>);
  STATIC_REQUIRE(std::is_base_of_v<comm::comm_error, comm::nccl_error>);
  STATIC_REQUIRE(std::tuple_size_v<comm::nccl::unique_id> == 128);
}

TEST_CASE("ncclGetUniqueId works without a GPU and gives fresh ids", "[cuda][nccl]") {
  const auto a = comm::nccl::make_unique_id();
  const auto b = comm::nccl::make_unique_id();
  CHECK_FALSE(all_zero(a));
  CHECK(a != b);
}

TEST_CASE("the unique id travels through a host communicator's broadcast", "[cuda][nccl]") {
  comm::local host;
  const auto id = comm::nccl::exchange_id(host);
  CHECK_FALSE(all_zero(id));
}

TEST_CASE("the unique id travels through the file store: every rank gets rank 0's", "[cuda][nccl]") {
  temp_store store;
  std::vector<comm::nccl::unique_id> got(3);
  std::vector<std::thread> ranks;
  for (std::size_t r = 3; r-- > 0;)  // followers start first: they wait for the file
    ranks.emplace_back([&, r] {
      comm::rank_info who;
      who.rank = r;
      who.world_size = 3;
      who.store_dir = store.dir.string();
      who.timeout = std::chrono::milliseconds(10000);
      got[r] = comm::nccl::exchange_id(who);
    });
  for (auto& t : ranks) t.join();
  CHECK_FALSE(all_zero(got[0]));
  CHECK(got[1] == got[0]);
  CHECK(got[2] == got[0]);
}

TEST_CASE("a follower whose rank 0 never publishes gets comm_error within the timeout", "[cuda][nccl]") {
  temp_store store;
  comm::rank_info who;
  who.rank = 1;
  who.world_size = 2;
  who.store_dir = store.dir.string();
  who.timeout = std::chrono::milliseconds(100);
  CHECK_THROWS_AS(comm::nccl::exchange_id(who), comm::comm_error);
  who.store_dir.clear();
  CHECK_THROWS_AS(comm::nccl::exchange_id(who), config_error);
}

TEST_CASE("rank 0's connect through the file store leaves no id file behind, made or failed", "[cuda][nccl]") {
  // A stale id in a reused store directory would be read by the next run's
  // ranks, which would then wait for a communicator that never forms.
  temp_store store;
  comm::rank_info who;
  who.rank = 0;
  who.world_size = 1;
  who.store_dir = store.dir.string();
  who.timeout = std::chrono::milliseconds(20000);
  const auto path = comm::nccl::id_path(who);
  std::ofstream(path, std::ios::binary) << std::string(128, 'x');  // an earlier run's
  try {
    auto c = comm::nccl::connect(who, {.device = 0});  // with a GPU: made; without: cudaSetDevice fails
    CHECK(c.size() == 1);
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice");
  }
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("the unique id travels through a Redis store, and rank 0's connect removes it", "[cuda][nccl]") {
  sluice_test::redis_server redis;
  if (!redis.ready()) {
    WARN("SKIPPED: no redis-server (/usr/bin/redis-server)");
    return;
  }
  const auto url = "redis://127.0.0.1:" + std::to_string(redis.port()) + "/run-" + std::to_string(::getpid());
  std::vector<comm::nccl::unique_id> got(3);
  std::vector<std::thread> ranks;
  for (std::size_t r = 3; r-- > 0;)  // followers start first: they wait for the key
    ranks.emplace_back([&, r] {
      comm::rank_info who;
      who.rank = r;
      who.world_size = 3;
      who.store = url;
      who.timeout = std::chrono::milliseconds(10000);
      got[r] = comm::nccl::exchange_id(who);
    });
  for (auto& t : ranks) t.join();
  CHECK_FALSE(all_zero(got[0]));
  CHECK(got[1] == got[0]);
  CHECK(got[2] == got[0]);

  // Rank 0's connect (one rank: made with a GPU, failed without) leaves no key:
  // a follower of a later run on the same prefix would read a stale id.
  comm::rank_info who;
  who.world_size = 1;
  who.store = url;
  who.timeout = std::chrono::milliseconds(2000);
  try {
    auto c = comm::nccl::connect(who, {.device = 0});
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice");
  }
  who.rank = 1;
  who.world_size = 2;
  who.timeout = std::chrono::milliseconds(200);
  CHECK_THROWS_AS(comm::nccl::exchange_id(who), comm::comm_error);  // nothing published: the key is gone
}

TEST_CASE("an aborted communicator refuses collectives and drains without waiting", "[cuda][nccl]") {
  SLUICE_REQUIRE_DEVICE();
  comm::local host;
  auto c = comm::nccl::connect(host, {.device = 0, .timeout = std::chrono::milliseconds(20000)});
  CHECK_FALSE(c.aborted());
  c.abort();
  CHECK(c.aborted());
  c.abort();  // idempotent
  CHECK(c.drain(c.stream()));  // nothing enqueued: idle at once
  auto buf = memory::device_buffer::allocate(4096, 0);
  CHECK_THROWS_AS(c.broadcast(buf.span(), 0), comm::comm_error);
  CHECK_THROWS_AS(c.barrier(), comm::comm_error);
  CHECK_THROWS_AS(c.wait(c.stream()), comm::comm_error);
}

TEST_CASE("without a driver joining a communicator throws cuda_error naming cudaSetDevice", "[cuda][nccl]") {
  SLUICE_REQUIRE_NO_DEVICE();
  comm::local host;
  try {
    auto c = comm::nccl::connect(host, {.device = 0, .timeout = std::chrono::milliseconds(2000)});
    FAIL("NCCL communicator without a driver");
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice");
  }
}

TEST_CASE("a one-rank NCCL communicator broadcasts and gathers and passes a barrier", "[cuda][nccl]") {
  SLUICE_REQUIRE_DEVICE();
  comm::local host;
  auto c = comm::nccl::connect(host, {.device = 0, .timeout = std::chrono::milliseconds(60000), .chunk_bytes = 1 << 20});
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  auto buf = memory::device_buffer::allocate(3 << 20, 0);
  std::vector<std::byte> in(buf.size(), std::byte{9}), out(buf.size());
  REQUIRE(cudaMemcpy(buf.data(), in.data(), in.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  c.broadcast(buf.span(), 0);  // three chunks
  auto gathered = memory::device_buffer::allocate(buf.size(), 0);
  c.all_gather(buf.span(), gathered.span());
  REQUIRE(cudaMemcpy(out.data(), gathered.data(), out.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(out == in);
  const std::size_t counts[] = {buf.size()};
  c.all_gather_v(buf.span(), counts);
  c.barrier();
}
