#pragma once
/// \file
/// `memory::pinned`: page-locked host memory that the GPU's copy engines read
/// at full PCIe/NVLink-C2C speed (pageable memory goes through a driver
/// bounce buffer). Two ways to get it:
/// - `pinned::allocate(n)`: cudaHostAlloc (portable), 4096-aligned;
/// - `pinned::map_and_register(n)`: an anonymous mapping (2 MiB aligned,
///   MADV_HUGEPAGE) registered with cudaHostRegister — ordinary process
///   memory, so O_DIRECT and io_uring fixed buffers work on it as on any
///   other mapping;
/// - `pinned::register_existing(span, keep)`: pins memory the caller owns.
/// Either is usable as a staging pool's memory (sluice/cuda/staging.hpp).
/// `bytes_pinned()` / `peak_bytes_pinned()` count what sluice pinned.

#include <cstddef>
#include <memory>
#include <span>

namespace sluice::inline v0::memory {

enum class pin_mode {
  host_alloc,     ///< cudaHostAlloc
  host_register,  ///< mmap + cudaHostRegister
};

/// Pinned host memory; copies share it, it is unpinned and freed when the
/// last copy (and the last holder of `keep()`) goes. Errors: cuda::cuda_error
/// naming the call.
class pinned {
 public:
  pinned() = default;

  /// `size` bytes of pinned memory (4096-aligned; 2 MiB for host_register).
  [[nodiscard]] static pinned allocate(std::size_t size, pin_mode mode = pin_mode::host_alloc);
  /// Same as allocate(size, pin_mode::host_register).
  [[nodiscard]] static pinned map_and_register(std::size_t size) { return allocate(size, pin_mode::host_register); }
  /// Pins `bytes` in place (cudaHostRegister, portable); `keep` keeps the
  /// memory alive at least as long as the registration.
  [[nodiscard]] static pinned register_existing(std::span<std::byte> bytes, std::shared_ptr<void> keep = {});

  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
  [[nodiscard]] std::byte* data() const noexcept { return bytes_.data(); }
  /// Shared ownership (unpins/frees when the last holder goes).
  [[nodiscard]] std::shared_ptr<void> keep() const noexcept { return keep_; }
  [[nodiscard]] explicit operator bool() const noexcept { return keep_ != nullptr; }

  /// Bytes sluice holds pinned right now, and the most at once since start
  /// (or since reset_peak()).
  [[nodiscard]] static std::size_t bytes_pinned() noexcept;
  [[nodiscard]] static std::size_t peak_bytes_pinned() noexcept;
  static void reset_peak() noexcept;

 private:
  std::shared_ptr<void> keep_;
  std::span<std::byte> bytes_;
};

}  // namespace sluice::inline v0::memory
