#include <catch2/catch.hpp>

#include <filesystem>

#include <sluice/memory/shared_host.hpp>

#include "../comm/multiprocess.hpp"

using namespace sluice;

namespace {
std::size_t dev_shm_entries() {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec); !ec && it != std::filesystem::directory_iterator(); ++it) ++n;
  return n;
}
}  // namespace

TEST_CASE("every local process maps the same shared segment and sees the others' writes", "[memory][shared_host]") {
  const auto before = dev_shm_entries();
  constexpr std::size_t size = 4u << 20, ranks = 4;
  auto seg = memory::shared_host::create(size);
  REQUIRE(reinterpret_cast<std::uintptr_t>(seg.bytes().data()) % 4096 == 0);
  const auto handle = seg.handle();
  // Each child attaches and writes its own quarter (a cooperative load).
  auto res = sluice_test::run_ranks(ranks, [&](std::size_t r) {
    auto mine = memory::shared_host::attach(handle, size);
    auto b = mine.bytes().subspan(r * size / ranks, size / ranks);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((r + i) & 0xff);
    return 0;
  });
  for (auto& x : res) REQUIRE(x.code == 0);
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size / ranks; i += 977) REQUIRE(seg.bytes()[r * size / ranks + i] == static_cast<std::byte>((r + i) & 0xff));
  seg.close_handle();
  REQUIRE(seg.size() == size);  // still mapped
  REQUIRE(dev_shm_entries() == before);  // a memfd never has a /dev/shm name
}

TEST_CASE("attaching after the creator closed its handle fails cleanly", "[memory][shared_host]") {
  auto seg = memory::shared_host::create(8192);
  const auto handle = seg.handle();
  REQUIRE_THROWS_AS(memory::shared_host::attach(handle, 4096), io_error);  // wrong size
  seg.close_handle();
  REQUIRE_THROWS_AS(seg.handle(), config_error);
  REQUIRE_THROWS_AS(memory::shared_host::attach(handle, 8192), io_error);
}

TEST_CASE("a view's lease keeps the segment mapped after the segment object goes", "[memory][shared_host]") {
  std::shared_ptr<void> keep;
  std::span<std::byte> bytes;
  {
    auto seg = memory::shared_host::create(4096);
    bytes = seg.bytes();
    keep = seg.keep();
  }
  bytes[0] = std::byte{1};
  REQUIRE(bytes[0] == std::byte{1});
}
