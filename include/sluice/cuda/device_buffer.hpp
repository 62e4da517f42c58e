#pragma once
/// \file
/// `memory::device_buffer`: one device allocation (cudaMalloc on a chosen
/// device), move-only, freed on destruction. Errors: cuda::cuda_error naming
/// the call (and `what`, e.g. the tensor, when given).

#include <cstddef>
#include <span>
#include <string>
#include <utility>

namespace sluice::inline v0::memory {

class device_buffer {
 public:
  device_buffer() = default;
  /// `size` bytes on `device` (-1: the current device). `what` names the
  /// allocation in errors (e.g. a tensor).
  [[nodiscard]] static device_buffer allocate(std::size_t size, int device = -1, const std::string& what = {});

  device_buffer(device_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)), device_(o.device_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { release(); }

  /// Device pointer (not dereferenceable on the host).
  [[nodiscard]] std::byte* data() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  /// A span of device memory (for device-memory collectives; never read it on the host).
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {ptr_, size_}; }
  [[nodiscard]] explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  void release() noexcept;
  std::byte* ptr_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
};

}  // namespace sluice::inline v0::memory
