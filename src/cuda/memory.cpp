// memory::pinned, memory::device_buffer, cuda::host_registration.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <sluice/cuda/error.hpp>
#include <sluice/cuda/host_register.hpp>
#include <sluice/cuda/device_buffer.hpp>
#include <sluice/cuda/pinned.hpp>

namespace sluice::inline v0 {
namespace {
std::atomic<std::size_t> g_pinned{0};
std::atomic<std::size_t> g_peak{0};

void count_pinned(std::size_t n) noexcept {
  const auto now = g_pinned.fetch_add(n) + n;
  auto peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void uncount_pinned(std::size_t n) noexcept { g_pinned.fetch_sub(n); }
}  // namespace

namespace memory {

pinned pinned::allocate(std::size_t size, pin_mode mode) {
  pinned p;
  if (size == 0) return p;
  if (mode == pin_mode::host_alloc) {
    void* raw = nullptr;
    cuda::check(::cudaHostAlloc(&raw, size, cudaHostAllocPortable), "cudaHostAlloc",
                {fmt::format("{} bytes of pinned memory", size)});
    std::size_t pad = 0;
    if (reinterpret_cast<std::uintptr_t>(raw) % 4096 != 0) {  // not expected; keep O_DIRECT alignment anyway
      (void)::cudaFreeHost(raw);
      cuda::check(::cudaHostAlloc(&raw, size + 4096, cudaHostAllocPortable), "cudaHostAlloc",
                  {fmt::format("{} bytes of pinned memory", size + 4096)});
      pad = (4096 - reinterpret_cast<std::uintptr_t>(raw) % 4096) % 4096;
    }
    const std::size_t counted = size + (pad ? 4096 : 0);
    count_pinned(counted);
    p.keep_ = std::shared_ptr<void>(raw, [counted](void* q) noexcept {
      (void)::cudaFreeHost(q);
      uncount_pinned(counted);
    });
    p.bytes_ = {static_cast<std::byte*>(raw) + pad, size};
    return p;
  }
  constexpr std::size_t huge = std::size_t{2} << 20;
  const std::size_t map_size = size + huge;
  void* m = ::mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    throw io_error(fmt::format("cannot map {} bytes for pinned memory: {}", map_size, std::strerror(errno)), {}, errno);
  auto* base = static_cast<std::byte*>(m);
  base += (huge - reinterpret_cast<std::uintptr_t>(base) % huge) % huge;
  ::madvise(base, size, MADV_HUGEPAGE);
  const auto e = ::cudaHostRegister(base, size, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    ::munmap(m, map_size);
    cuda::check(e, "cudaHostRegister", {fmt::format("{} bytes of staging memory", size)});
  }
  count_pinned(size);
  p.keep_ = std::shared_ptr<void>(base, [m, map_size, size](void* q) noexcept {
    (void)::cudaHostUnregister(q);
    ::munmap(m, map_size);
    uncount_pinned(size);
  });
  p.bytes_ = {base, size};
  return p;
}

pinned pinned::register_existing(std::span<std::byte> bytes, std::shared_ptr<void> keep) {
  pinned p;
  if (bytes.empty()) return p;
  cuda::check(::cudaHostRegister(bytes.data(), bytes.size(), cudaHostRegisterPortable), "cudaHostRegister",
              {fmt::format("{} bytes at {}", bytes.size(), static_cast<const void*>(bytes.data()))});
  const std::size_t n = bytes.size();
  count_pinned(n);
  p.keep_ = std::shared_ptr<void>(bytes.data(), [keep = std::move(keep), n](void* q) mutable noexcept {
    (void)::cudaHostUnregister(q);
    uncount_pinned(n);
    keep.reset();
  });
  p.bytes_ = bytes;
  return p;
}

std::size_t pinned::bytes_pinned() noexcept { return g_pinned.load(); }
std::size_t pinned::peak_bytes_pinned() noexcept { return g_peak.load(); }
void pinned::reset_peak() noexcept { g_peak.store(g_pinned.load()); }

device_buffer device_buffer::allocate(std::size_t size, int device, const std::string& what) {
  device_buffer b;
  error_context ctx{"", what};
  if (device < 0) {
    cuda::check(::cudaGetDevice(&device), "cudaGetDevice", ctx);
  } else {
    cuda::check(::cudaSetDevice(device), "cudaSetDevice", ctx);
  }
  b.device_ = device;
  if (size == 0) return b;
  void* p = nullptr;
  cuda::check(::cudaMalloc(&p, size), fmt::format("cudaMalloc({} bytes)", size), ctx);
  b.ptr_ = static_cast<std::byte*>(p);
  b.size_ = size;
  return b;
}

void device_buffer::release() noexcept {
  if (ptr_) (void)::cudaFree(ptr_);
  ptr_ = nullptr;
  size_ = 0;
}

}  // namespace memory

namespace cuda {

host_registration host_registration::register_mapped(std::span<std::byte> bytes, std::shared_ptr<void> keep,
                                                     bool read_only) {
  host_registration r;
  if (bytes.empty()) return r;
  const error_context ctx{fmt::format("{} bytes of host memory at {}", bytes.size(), static_cast<const void*>(bytes.data()))};
  unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
  // The read-only flag is a promise that lets the device cache the memory; a
  // device that cannot take it (cudaDevAttrHostRegisterReadOnlySupported 0,
  // as on some x86 hosts) fails the whole registration with
  // cudaErrorNotSupported. There it is left out: the mapping works the same,
  // only without that caching.
  if (read_only) {
    int device = 0, supported = 0;
    check(::cudaGetDevice(&device), "cudaGetDevice", ctx);
    check(::cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device),
          "cudaDeviceGetAttribute(cudaDevAttrHostRegisterReadOnlySupported)", ctx);
    read_only = supported != 0;
  }
  if (read_only) flags |= cudaHostRegisterReadOnly;
  check(::cudaHostRegister(bytes.data(), bytes.size(), flags), "cudaHostRegister", ctx);
  void* dev = nullptr;
  if (const auto e = ::cudaHostGetDevicePointer(&dev, bytes.data(), 0); e != cudaSuccess) {
    (void)::cudaHostUnregister(bytes.data());
    check(e, "cudaHostGetDevicePointer", ctx);
  }
  count_pinned(bytes.size());
  r.keep_ = std::move(keep);
  r.host_ = bytes;
  r.device_ = dev;
  r.read_only_ = read_only;
  return r;
}

void host_registration::unregister() noexcept {
  if (host_.data()) {
    (void)::cudaHostUnregister(host_.data());
    uncount_pinned(host_.size());
  }
  host_ = {};
  device_ = nullptr;
  read_only_ = false;
  keep_.reset();
}

}  // namespace cuda
}  // namespace sluice::inline v0
