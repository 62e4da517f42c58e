#pragma once
/// \file
/// Registers host memory with CUDA, mapped: kernels read it in place through
/// `device_pointer()` (zero-copy over PCIe / NVLink-C2C) and copies from it
/// run at pinned speed. Used for the node's shared host segment, the home of
/// offloaded tables: every local rank registers its own mapping of it.
///
///   auto seg = memory::shared_host::attach(handle, size);
///   auto reg = cuda::host_registration::register_shared(seg);  // keeps `seg` mapped
///   kernel<<<...>>>(static_cast<const T*>(reg.device_pointer()), ...);

#include <cstddef>
#include <memory>
#include <span>
#include <utility>

#include <sluice/memory/shared_host.hpp>

namespace sluice::inline v0::cuda {

class host_registration {
 public:
  host_registration() = default;
  /// cudaHostRegister(bytes, portable | mapped [| read-only]) on the current
  /// device; `keep` keeps the memory alive at least until unregistered. The
  /// read-only flag is used only where the device supports it
  /// (cudaDevAttrHostRegisterReadOnlySupported; read_only() tells): elsewhere
  /// it would fail the call with cudaErrorNotSupported. Throws cuda_error naming the call.
  [[nodiscard]] static host_registration register_mapped(std::span<std::byte> bytes, std::shared_ptr<void> keep = {},
                                                         bool read_only = false);
  /// Registers the whole shared segment (and keeps its mapping alive).
  [[nodiscard]] static host_registration register_shared(const memory::shared_host& segment, bool read_only = false) {
    return register_mapped(segment.bytes(), segment.keep(), read_only);
  }

  host_registration(host_registration&& o) noexcept
      : keep_(std::move(o.keep_)),
        host_(std::exchange(o.host_, {})),
        device_(std::exchange(o.device_, nullptr)),
        read_only_(std::exchange(o.read_only_, false)) {}
  host_registration& operator=(host_registration&& o) noexcept {
    if (this != &o) {
      unregister();
      keep_ = std::move(o.keep_);
      host_ = std::exchange(o.host_, {});
      device_ = std::exchange(o.device_, nullptr);
      read_only_ = std::exchange(o.read_only_, false);
    }
    return *this;
  }
  host_registration(const host_registration&) = delete;
  host_registration& operator=(const host_registration&) = delete;
  /// cudaHostUnregister (errors ignored), then the memory may go.
  ~host_registration() { unregister(); }

  [[nodiscard]] std::span<std::byte> host() const noexcept { return host_; }
  /// The device-side address of host()[0] (cudaHostGetDevicePointer).
  [[nodiscard]] void* device_pointer() const noexcept { return device_; }
  [[nodiscard]] explicit operator bool() const noexcept { return host_.data() != nullptr; }
  /// Whether it was registered read-only (asked for, and supported by the device).
  [[nodiscard]] bool read_only() const noexcept { return read_only_; }

 private:
  void unregister() noexcept;
  std::shared_ptr<void> keep_;  // released after unregister()
  std::span<std::byte> host_;
  void* device_ = nullptr;
  bool read_only_ = false;
};

}  // namespace sluice::inline v0::cuda
