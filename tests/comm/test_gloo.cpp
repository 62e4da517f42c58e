#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include <sluice/comm/gloo.hpp>
#include <sluice/comm/local.hpp>

#include "multiprocess.hpp"

using namespace sluice;
using namespace std::chrono_literals;

namespace {
std::byte pattern(std::size_t rank, std::size_t i) { return static_cast<std::byte>((rank * 131 + i * 7) & 0xff); }

comm::gloo connect(std::size_t rank, std::size_t n, const std::filesystem::path& dir, std::chrono::milliseconds t = 20s) {
  return comm::gloo(rank, n, comm::gloo_options{dir.string(), "127.0.0.1", t});
}
}  // namespace

TEST_CASE("communicators model the concept", "[comm][concepts]") {
  STATIC_REQUIRE(comm::communicator<comm::local>);
  STATIC_REQUIRE(comm::communicator<comm::gloo>);
  comm::local c;
  std::vector<std::byte> in(4, std::byte{7}), out(4);
  c.all_gather(in, out);
  REQUIRE(out == in);
  REQUIRE_THROWS_AS(c.broadcast(out, 1), comm::comm_error);
}

TEST_CASE("4 gloo ranks broadcast, all-gather and all-gather-v over loopback", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloo4");
  auto res = sluice_test::run_ranks(4, [&](std::size_t rank) {
    auto c = connect(rank, 4, dir);
    // broadcast 8 MiB from rank 2
    std::vector<std::byte> buf(8u << 20);
    if (rank == 2)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(2, i);
    c.broadcast(buf, 2);
    for (std::size_t i = 0; i < buf.size(); i += 4093)
      if (buf[i] != pattern(2, i)) return 10;
    // all_gather 16 bytes each
    std::vector<std::byte> mine(16), all(64);
    for (std::size_t i = 0; i < 16; ++i) mine[i] = pattern(rank, i);
    c.all_gather(mine, all);
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t i = 0; i < 16; ++i)
        if (all[r * 16 + i] != pattern(r, i)) return 11;
    // all_gather_v, uneven (one rank contributes nothing), in place
    const std::vector<std::size_t> counts{1000, 0, 333333, 17};
    std::vector<std::byte> v(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    const std::size_t at = std::accumulate(counts.begin(), counts.begin() + static_cast<long>(rank), std::size_t{0});
    for (std::size_t i = 0; i < counts[rank]; ++i) v[at + i] = pattern(rank, i);
    c.all_gather_v(v, counts);
    std::size_t off = 0;
    for (std::size_t r = 0; r < 4; ++r) {
      for (std::size_t i = 0; i < counts[r]; ++i)
        if (v[off + i] != pattern(r, i)) return 12;
      off += counts[r];
    }
    c.barrier();
    return 0;
  });
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    REQUIRE(res[r].code == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("8 gloo ranks meet through one file store", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloo8");
  auto res = sluice_test::run_ranks(8, [&](std::size_t rank) {
    auto c = connect(rank, 8, dir);
    std::vector<std::byte> mine(8, static_cast<std::byte>(rank)), all(64);
    c.all_gather(mine, all);
    for (std::size_t r = 0; r < 8; ++r)
      if (all[r * 8] != static_cast<std::byte>(r)) return 10;
    c.barrier();
    return 0;
  });
  for (std::size_t r = 0; r < 8; ++r) REQUIRE(res[r].code == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a dead peer makes the others' collective throw, not hang", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloodead");
  auto res = sluice_test::run_ranks(
      3,
      [&](std::size_t rank) {
        auto c = connect(rank, 3, dir, 5s);
        c.barrier();
        if (rank == 1) ::_exit(9);  // dies without a word
        std::vector<std::byte> buf(1u << 20);
        try {
          c.broadcast(buf, 1);
        } catch (const comm::comm_error& e) {
          std::fprintf(stderr, "rank %zu: %s\n", rank, e.what());
          return 42;
        }
        return 0;
      },
      60s);
  REQUIRE(res[1].code == 9);
  REQUIRE(res[0].code == 42);
  REQUIRE(res[2].code == 42);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a missing peer makes rendezvous time out with comm_error", "[comm][gloo]") {
  const auto dir = sluice_test::fresh_dir("gloomissing");
  REQUIRE_THROWS_AS(connect(0, 2, dir, 1s), comm::comm_error);
  std::filesystem::remove_all(dir);
}
