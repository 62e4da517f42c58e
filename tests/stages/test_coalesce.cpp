// tests for <sluice/stages/coalesce.hpp> and <sluice/stages/pipeline.hpp>
#include <utility>

#include <map>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <sluice/stages/coalesce.hpp>
#include <sluice/stages/pipeline.hpp>

#include "support/coro.hpp"

using namespace sluice;

namespace {
// Tensors laid out back to back in `files` shards.
std::vector<tensor_ref> layout(const std::vector<std::pair<std::uint32_t, std::uint64_t>>& shard_and_size) {
  std::vector<tensor_ref> v;
  std::map<std::uint32_t, std::uint64_t> next;
  for (auto [shard, size] : shard_and_size) {
    tensor_ref t;
    t.name = fmt::format("t{}", v.size());
    t.shard = shard;
    t.offset = next[shard] + 64;
    t.size = size;
    next[shard] += size;
    v.push_back(t);
  }
  return v;
}

std::vector<read_request> coalesced(const std::vector<tensor_ref>& ts, std::uint64_t max_read,
                                    std::span<std::byte> direct_for_last = {}) {
  std::vector<byte_extent> jobs;
  for (const auto& t : ts) jobs.push_back(byte_extent::whole(t));
  if (!direct_for_last.empty()) jobs.back().direct = direct_for_last;
  coalesce c({max_read});
  std::vector<read_request> out;
  sluice_test::run(run_pipeline(c, jobs, [&](read_request r) { out.push_back(std::move(r)); }));
  return out;
}
}  // namespace

TEST_CASE("adjacent tensors of one file merge up to max_read", "[stages][coalesce]") {
  auto ts = layout({{0, 100}, {0, 200}, {0, 300}, {0, 500}});
  auto rs = coalesced(ts, 600);
  REQUIRE(rs.size() == 2);
  REQUIRE(rs[0].offset == ts[0].offset);
  REQUIRE(rs[0].length == 600);
  REQUIRE(rs[0].pieces.size() == 3);
  REQUIRE(rs[1].length == 500);
}

TEST_CASE("tensors of different files never share a request", "[stages][coalesce]") {
  auto ts = layout({{0, 100}, {1, 100}, {1, 100}});
  auto rs = coalesced(ts, 1 << 20);
  REQUIRE(rs.size() == 2);
  REQUIRE(rs[0].file == 0);
  REQUIRE(rs[1].file == 1);
  REQUIRE(rs[1].pieces.size() == 2);
}

TEST_CASE("a tensor larger than max_read is split into ordered chunks", "[stages][coalesce]") {
  auto ts = layout({{0, 10}, {0, 2500}, {0, 10}});
  auto rs = coalesced(ts, 1000);
  REQUIRE(rs.size() == 5);  // [t0] [t1 0..1000) [1000..2000) [2000..2500) [t2]
  REQUIRE(rs[1].pieces[0].tensor_offset == 0);
  REQUIRE(rs[2].pieces[0].tensor_offset == 1000);
  REQUIRE(rs[3].pieces[0].length == 500);
  std::uint64_t covered = 0;
  for (const auto& r : rs)
    for (const auto& p : r.pieces) covered += p.length;
  REQUIRE(covered == 2520);
}

TEST_CASE("thousands of tiny tensors coalesce into a few requests", "[stages][coalesce]") {
  std::vector<std::pair<std::uint32_t, std::uint64_t>> spec(5000, {0, 100});
  auto ts = layout(spec);
  auto rs = coalesced(ts, 64 << 10);
  REQUIRE(rs.size() == 8);  // 500,000 bytes / 65,536 per request (655 tensors each)
  std::size_t pieces = 0;
  for (const auto& r : rs) pieces += r.pieces.size();
  REQUIRE(pieces == 5000);
}

TEST_CASE("a tensor with a direct destination gets requests of its own", "[stages][coalesce]") {
  auto ts = layout({{0, 100}, {0, 2000}});
  std::vector<std::byte> dst(2000);
  auto rs = coalesced(ts, 1500, dst);
  REQUIRE(rs.size() == 3);
  REQUIRE(rs[0].direct.empty());
  REQUIRE(rs[1].direct.data() == dst.data());
  REQUIRE(rs[2].direct.data() == dst.data() + 1500);
}

TEST_CASE("zero-size tensors ride along with their neighbours", "[stages][coalesce]") {
  auto ts = layout({{0, 100}, {0, 0}, {0, 100}});
  auto rs = coalesced(ts, 1 << 20);
  REQUIRE(rs.size() == 1);
  REQUIRE(rs[0].pieces.size() == 3);
}

TEST_CASE("extents of tensors coalesce like tensors: adjacent slices of one tensor share a request", "[stages][coalesce]") {
  auto ts = layout({{0, 1000}, {0, 500}});
  std::vector<byte_extent> jobs{{&ts[0], 0, 400, {}}, {&ts[0], 400, 600, {}}, {&ts[1], 100, 200, {}}};
  coalesce c({10000});
  std::vector<read_request> out;
  sluice_test::run(run_pipeline(c, jobs, [&](read_request r) { out.push_back(std::move(r)); }));
  REQUIRE(out.size() == 2);  // the second tensor's slice starts 100 bytes after the first tensor's end
  REQUIRE(out[0].offset == ts[0].offset);
  REQUIRE(out[0].length == 1000);
  REQUIRE(out[0].pieces.size() == 2);
  REQUIRE(out[0].pieces[1].tensor_offset == 400);  // offsets within the tensor, as for whole tensors
  REQUIRE(out[1].offset == ts[1].offset + 100);
  REQUIRE(out[1].length == 200);
  REQUIRE(out[1].pieces[0].tensor_offset == 100);
}

TEST_CASE("with an alignment no request crosses one of its multiples, and every byte is requested once",
          "[stages][coalesce]") {
  // Tensors start at 64 (layout's header room), so most straddle a 1000-byte boundary.
  auto ts = layout({{0, 300}, {0, 900}, {0, 2600}, {0, 50}, {0, 50}, {1, 1500}});
  std::vector<std::byte> dst(1500);
  for (const std::uint64_t max_read : {700u, 4096u}) {
    INFO("max_read " << max_read);
    std::vector<byte_extent> jobs;
    for (const auto& t : ts) jobs.push_back(byte_extent::whole(t));
    jobs.back().direct = dst;   // a direct destination is cut alike
    coalesce c({max_read, 1000});
    std::vector<read_request> rs;
    sluice_test::run(run_pipeline(c, jobs, [&](read_request r) { rs.push_back(std::move(r)); }));
    std::map<std::uint32_t, std::uint64_t> next{{0, ts[0].offset}, {1, ts[5].offset}};
    for (const auto& r : rs) {
      INFO("request " << r.file << ":" << r.offset << "+" << r.length);
      CHECK(r.length <= max_read);
      CHECK(r.offset / 1000 == (r.end() - 1) / 1000);   // inside one block
      CHECK(r.offset == next[r.file]);                  // in order, no gap, no overlap
      next[r.file] = r.end();
      std::uint64_t pieces = 0;
      for (const auto& p : r.pieces) pieces += p.length;
      CHECK(pieces == r.length);
      if (r.file == 1) CHECK(r.direct.data() == dst.data() + (r.offset - ts[5].offset));
    }
    CHECK(next[0] == ts[4].offset + ts[4].size);
    CHECK(next[1] == ts[5].offset + ts[5].size);
    // Merging still happens inside a block: the two 50-byte tensors share one request.
    std::size_t shared = 0;
    for (const auto& r : rs) shared += r.pieces.size() > 1;
    CHECK(shared >= 1);
  }
}

TEST_CASE("extents read through the page cache never share a request with extents read past it", "[stages][coalesce]") {
  // byte_extent::via_page_cache: a request is read one way or the other.
  auto ts = layout({{0, 100}, {0, 100}, {0, 100}, {0, 100}});
  std::vector<byte_extent> jobs;
  for (const auto& t : ts) jobs.push_back(byte_extent::whole(t));
  jobs[2].via_page_cache = jobs[3].via_page_cache = true;
  coalesce c({1 << 20});
  std::vector<read_request> out;
  sluice_test::run(run_pipeline(c, jobs, [&](read_request r) { out.push_back(std::move(r)); }));
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].pieces.size() == 2);
  REQUIRE_FALSE(out[0].via_page_cache);
  REQUIRE(out[1].pieces.size() == 2);
  REQUIRE(out[1].via_page_cache);
}

