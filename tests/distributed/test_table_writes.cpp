// detail::table_lanes (distributed/table_writes.hpp): a rank's writes into the
// node's shared segment, cut at the pieces and dealt to its writer threads.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include <sluice/distributed/table_writes.hpp>

using sluice::detail::table_lanes;
using sluice::detail::table_write;
using sluice::tensor_ref;

namespace {

constexpr std::uint64_t mib = 1u << 20;

// The piece holding segment byte `at`.
std::size_t piece_of(const std::vector<std::uint64_t>& pieces, std::uint64_t at) {
  std::size_t i = 0;
  while (i + 1 < pieces.size() && pieces[i + 1] <= at) ++i;
  return i;
}

// Every lane's parts, in order of where they lie in the segment.
std::vector<table_write> all_parts(const std::vector<std::vector<table_write>>& lanes) {
  std::vector<table_write> out;
  for (const auto& l : lanes) out.insert(out.end(), l.begin(), l.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.at < b.at; });
  return out;
}

}  // namespace

TEST_CASE("a rank's share of one table spanning its 4 pieces goes to as many threads as it has, a piece each",
          "[distributed][offload]") {
  // One write: a table's slice of 8 MiB at segment offset 2 MiB, over the
  // rank's pieces at 2, 4, 6 and 8 MiB (the next rank's begin at 10).
  tensor_ref t;
  const std::vector<std::uint64_t> pieces{0, 2 * mib, 4 * mib, 6 * mib, 8 * mib, 10 * mib};
  const std::vector<table_write> writes{{&t, 100, 8 * mib, 2 * mib}};
  for (const std::size_t threads : {1, 2, 3, 4, 8}) {
    INFO(threads << " threads");
    const auto lanes = table_lanes(writes, pieces, threads);
    REQUIRE(lanes.size() == std::min<std::size_t>(threads, 4));
    // The parts tile the write exactly: same tensor bytes at the same places.
    const auto parts = all_parts(lanes);
    REQUIRE(parts.size() == 4);
    std::uint64_t at = 2 * mib, offset = 100;
    for (const auto& p : parts) {
      REQUIRE(p.t == &t);
      REQUIRE(p.at == at);
      REQUIRE(p.offset == offset);
      REQUIRE(p.size == 2 * mib);
      at += p.size, offset += p.size;
    }
    // No part crosses a piece, and no piece is written by two lanes.
    std::set<std::size_t> seen;
    for (const auto& lane : lanes) {
      std::set<std::size_t> mine;
      for (const auto& p : lane) {
        REQUIRE(piece_of(pieces, p.at) == piece_of(pieces, p.at + p.size - 1));
        mine.insert(piece_of(pieces, p.at));
      }
      for (auto m : mine) REQUIRE(seen.insert(m).second);
    }
  }
}

TEST_CASE("table writes within one piece stay whole and in one lane, and no writes make no lanes", "[distributed][offload]") {
  tensor_ref a, b;
  const std::vector<std::uint64_t> pieces{0, 4 * mib};
  const std::vector<table_write> writes{{&a, 0, mib, 0}, {&b, 8, mib, 2 * mib}};
  const auto lanes = table_lanes(writes, pieces, 4);
  REQUIRE(lanes.size() == 1);
  REQUIRE(lanes[0] == writes);
  REQUIRE(table_lanes({}, pieces, 4).empty());
  // A segment of one piece (no starts given): one lane, the write whole.
  const auto one = table_lanes(writes, {}, 4);
  REQUIRE(one.size() == 1);
  REQUIRE(one[0] == writes);
}
