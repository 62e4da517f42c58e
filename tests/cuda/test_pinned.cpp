// tests for <sluice/cuda/pinned.hpp>, <sluice/cuda/device_buffer.hpp>,
// <sluice/cuda/staging.hpp> and the staging pool's external-memory hook.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/cuda/staging.hpp>
#include <sluice/cuda/device_buffer.hpp>
#include <sluice/cuda/pinned.hpp>

#include "device_or_skip.hpp"

using namespace sluice;

namespace {
template <class F>
bool throws_cuda_call(F f, const std::string& call) {
  try {
    f();
  } catch (const cuda::cuda_error& e) {
    return e.call().rfind(call, 0) == 0;
  }
  return false;
}
}  // namespace

TEST_CASE("a staging pool cuts external memory into slots and keeps it until the last lease", "[cuda][staging]") {
  constexpr std::size_t n = 4 * 8192;
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(m != MAP_FAILED);
  bool freed = false;
  std::shared_ptr<void> keep(m, [&freed](void* p) { ::munmap(p, n); freed = true; });
  std::optional<lease> held;
  {
    staging_options o;
    o.budget = 1 << 20;  // more than the region: clamped to it
    o.slot_size = 8192;
    o.poison = true;
    o.memory = {{static_cast<std::byte*>(m), n}, std::move(keep)};
    staging_pool pool(std::move(o));
    CHECK(pool.slot_count() == 4);
    CHECK(pool.region().data() == static_cast<std::byte*>(m));
    auto l = pool.try_acquire();
    REQUIRE(l);
    CHECK(pool.slot_index(l->bytes().data()) == 0);
    std::memset(l->bytes().data(), 7, l->bytes().size());
    held = std::move(l);
  }
  CHECK_FALSE(freed);  // a lease outlives the pool: the memory stays
  CHECK(static_cast<int>(held->bytes()[100]) == 7);
  held.reset();
  CHECK(freed);
}

TEST_CASE("a staging pool rejects misaligned external memory", "[cuda][staging]") {
  std::vector<std::byte> v(3 * 4096);
  auto* p = v.data() + (4096 - reinterpret_cast<std::uintptr_t>(v.data()) % 4096) % 4096 + 16;
  staging_options o;
  o.slot_size = 4096;
  o.memory = {{p, 4096}, {}};
  CHECK_THROWS_AS(staging_pool(std::move(o)), config_error);
}

TEST_CASE("without a driver pinning and device allocation throw cuda_error naming the call", "[cuda][pinned]") {
  SLUICE_REQUIRE_NO_DEVICE();
  const auto before = memory::pinned::bytes_pinned();
  CHECK(throws_cuda_call([] { (void)memory::pinned::allocate(1 << 20); }, "cudaHostAlloc"));
  CHECK(throws_cuda_call([] { (void)memory::pinned::map_and_register(1 << 20); }, "cudaHostRegister"));
  std::vector<std::byte> arena(1 << 16);
  CHECK(throws_cuda_call([&] { (void)memory::pinned::register_existing(arena); }, "cudaHostRegister"));
  CHECK(throws_cuda_call([] { (void)cuda::make_pinned_pool({.budget = 1 << 20, .slot_size = 1 << 18}); },
                         "cudaHostRegister"));
  CHECK(memory::pinned::bytes_pinned() == before);  // nothing counted, nothing leaked
  try {
    (void)memory::device_buffer::allocate(4096, 0, "model.embed_tokens.weight");
    FAIL("allocated device memory without a driver");
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice");
    CHECK(e.tensor() == "model.embed_tokens.weight");
  }
  CHECK(throws_cuda_call([] { (void)memory::device_buffer::allocate(4096); }, "cudaGetDevice"));
}

TEST_CASE("pinned memory is page-locked and aligned for O_DIRECT and counted", "[cuda][pinned]") {
  SLUICE_REQUIRE_DEVICE();
  memory::pinned::reset_peak();
  const auto before = memory::pinned::bytes_pinned();
  for (auto mode : {memory::pin_mode::host_alloc, memory::pin_mode::host_register}) {
    auto p = memory::pinned::allocate(8 << 20, mode);
    CHECK(reinterpret_cast<std::uintptr_t>(p.data()) % 4096 == 0);
    CHECK(memory::pinned::bytes_pinned() >= before + (8 << 20));
    cudaPointerAttributes a{};
    REQUIRE(cudaPointerGetAttributes(&a, p.data()) == cudaSuccess);
    CHECK(a.type == cudaMemoryTypeHost);
    // O_DIRECT reads straight into it.
    const auto path = std::filesystem::temp_directory_path() / ("sluice-pinned-" + std::to_string(::getpid()));
    {
      std::ofstream f(path, std::ios::binary);
      std::vector<char> data(1 << 20, 'x');
      f.write(data.data(), static_cast<std::streamsize>(data.size()));
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd >= 0) {
      const auto n = ::pread(fd, p.data(), 1 << 20, 0);
      CHECK(n == (1 << 20));
      CHECK(static_cast<char>(p.data()[12345]) == 'x');
      ::close(fd);
    } else {
      WARN("O_DIRECT not supported on " << path << ": " << std::strerror(errno));
    }
    std::filesystem::remove(path);
  }
  CHECK(memory::pinned::bytes_pinned() == before);
  CHECK(memory::pinned::peak_bytes_pinned() >= before + (8 << 20));
}

TEST_CASE("a pinned staging pool's slots are pinned", "[cuda][staging]") {
  SLUICE_REQUIRE_DEVICE();
  auto pool = cuda::make_pinned_pool({.budget = 8 << 20, .slot_size = 2 << 20, .poison = false});
  CHECK(pool.slot_count() == 4);
  auto l = pool.try_acquire();
  REQUIRE(l);
  cudaPointerAttributes a{};
  REQUIRE(cudaPointerGetAttributes(&a, l->bytes().data()) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeHost);
}

TEST_CASE("device buffers allocate and copy and report a failed cudaMalloc with its size and name", "[cuda][device]") {
  SLUICE_REQUIRE_DEVICE();
  auto b = memory::device_buffer::allocate(1 << 20, 0, "t");
  CHECK(b.size() == (1 << 20));
  std::vector<std::byte> in(1 << 20, std::byte{3}), out(1 << 20);
  REQUIRE(cudaMemcpy(b.data(), in.data(), in.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(out.data(), b.data(), out.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(out == in);
  try {
    (void)memory::device_buffer::allocate(std::size_t{1} << 50, 0, "too.big");
    FAIL("allocated 1 PiB");
  } catch (const cuda::cuda_error& e) {
    CHECK(e.call().rfind("cudaMalloc", 0) == 0);
    CHECK(e.tensor() == "too.big");
  }
}
