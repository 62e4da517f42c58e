// tests for <sluice/cuda/error.hpp> and <sluice/cuda/device.hpp>
#include <string>

#include <catch2/catch.hpp>

#include <sluice/cuda/device.hpp>
#include <sluice/cuda/error.hpp>

#include "device_or_skip.hpp"

using namespace sluice;
using Catch::Matchers::Contains;

TEST_CASE("a failed CUDA call is a cuda_error naming the call and the error and the tensor", "[cuda][error]") {
  try {
    cuda::check(cudaErrorInvalidValue, "cudaMemcpyAsync", {"", "model.layers.0.w", byte_range{16, 32}});
    FAIL("check did not throw");
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaMemcpyAsync");
    CHECK(e.code() == cudaErrorInvalidValue);
    CHECK(e.tensor() == "model.layers.0.w");
    CHECK_THAT(e.what(), Contains("cudaMemcpyAsync failed: cudaErrorInvalidValue (1)"));
    CHECK_THAT(e.what(), Contains("tensor 'model.layers.0.w'"));
    CHECK_THAT(e.what(), Contains("bytes [16, 32)"));
  }
  STATIC_REQUIRE(std::is_base_of_v<sluice::error, cuda::cuda_error>);
  CHECK_NOTHROW(cuda::check(cudaSuccess, "cudaFree"));
}

TEST_CASE("SLUICE_CUDA_CHECK names the call by its text", "[cuda][error]") {
  SLUICE_REQUIRE_NO_DEVICE();
  void* p = nullptr;
  try {
    SLUICE_CUDA_CHECK(cudaMalloc(&p, 64));
    FAIL("cudaMalloc succeeded without a driver");
  } catch (const cuda::cuda_error& e) {
    CHECK_THAT(e.call(), Contains("cudaMalloc(&p, 64)"));
    CHECK(e.code() != cudaSuccess);
  }
}

TEST_CASE("without a driver the device query reports zero devices and why", "[cuda][device]") {
  SLUICE_REQUIRE_NO_DEVICE();
  const auto q = cuda::query_devices();
  CHECK(q.count == 0);
  CHECK_FALSE(q);
  CHECK(q.status != cudaSuccess);
  CHECK_THAT(q.reason(), Contains("cudaGetDeviceCount: cudaError"));
  CHECK(cuda::device_count() == 0);
  // Asking twice gives the same answer (no sticky state from the first).
  CHECK(cuda::query_devices().status == q.status);
}

TEST_CASE("without a driver creating a stream or an event throws naming the call", "[cuda][device]") {
  SLUICE_REQUIRE_NO_DEVICE();
  CHECK_THROWS_MATCHES(cuda::stream(), cuda::cuda_error,
                       Catch::Predicate<cuda::cuda_error>([](const auto& e) { return e.call() == "cudaStreamCreateWithFlags"; }));
  CHECK_THROWS_MATCHES(cuda::event(), cuda::cuda_error,
                       Catch::Predicate<cuda::cuda_error>([](const auto& e) { return e.call() == "cudaEventCreateWithFlags"; }));
}

TEST_CASE("with a device the query counts it and streams and events work", "[cuda][device]") {
  SLUICE_REQUIRE_DEVICE();
  const auto q = cuda::query_devices();
  CHECK(q.count >= 1);
  CHECK(q.status == cudaSuccess);
  cuda::stream s;
  cuda::event e;
  e.record(s.get());
  e.synchronize();
  CHECK(e.ready());
  s.synchronize();
}
