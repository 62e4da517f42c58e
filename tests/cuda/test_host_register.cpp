// tests for <sluice/cuda/host_register.hpp>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/cuda/host_register.hpp>
#include <sluice/cuda/pinned.hpp>

#include "device_or_skip.hpp"

using namespace sluice;

TEST_CASE("without a driver registering the shared segment throws naming cudaHostRegister", "[cuda][host_register]") {
  SLUICE_REQUIRE_NO_DEVICE();
  auto seg = memory::shared_host::create(1 << 20);
  try {
    (void)cuda::host_registration::register_shared(seg);
    FAIL("registered without a driver");
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaHostRegister");
    CHECK_THAT(e.what(), Catch::Matchers::Contains("1048576 bytes of host memory"));
  }
}

TEST_CASE("the shared segment registered mapped is readable through its device pointer", "[cuda][host_register]") {
  SLUICE_REQUIRE_DEVICE();
  auto seg = memory::shared_host::create(4 << 20);
  for (std::size_t i = 0; i < seg.size(); ++i) seg.bytes()[i] = static_cast<std::byte>(i * 7);
  const auto before = memory::pinned::bytes_pinned();
  // Read-only where the device supports it; elsewhere (some x86 hosts) the
  // flag would fail the call with cudaErrorNotSupported, so it is left out.
  int device = 0, supported = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device) == cudaSuccess);
  {
    auto reg = cuda::host_registration::register_shared(seg, /*read_only=*/true);
    REQUIRE(reg);
    CHECK(reg.read_only() == (supported != 0));
    REQUIRE(reg.device_pointer() != nullptr);
    CHECK(memory::pinned::bytes_pinned() == before + seg.size());
    // A device-side read of the mapping (device -> host copy from the device address).
    std::vector<std::byte> out(seg.size());
    REQUIRE(cudaMemcpy(out.data(), reg.device_pointer(), out.size(), cudaMemcpyDefault) == cudaSuccess);
    CHECK(std::memcmp(out.data(), seg.bytes().data(), out.size()) == 0);
    auto moved = std::move(reg);
    CHECK_FALSE(reg);
    CHECK(moved);
  }
  CHECK(memory::pinned::bytes_pinned() == before);
}
