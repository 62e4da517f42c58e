#pragma once
/// \file
/// `lease`: shared ownership of bytes that sluice lent out — a staging slot
/// (returned to its pool when the last lease is released) or an owned buffer.
/// A view into staging memory is only reachable through a lease, so a model
/// cannot keep a bare pointer into a buffer that will be reused.

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>

namespace sluice::inline v0 {

class lease {
 public:
  lease() = default;
  /// Shares ownership of `keep` (whose destruction releases `bytes`).
  lease(std::shared_ptr<void> keep, std::span<std::byte> bytes) noexcept : keep_(std::move(keep)), bytes_(bytes) {}

  /// A new heap buffer of `size` bytes aligned to `alignment` (a power of two).
  [[nodiscard]] static lease allocate(std::size_t size, std::size_t alignment = 4096) {
    const std::size_t rounded = (size + alignment - 1) / alignment * alignment;
    void* p = rounded ? std::aligned_alloc(alignment, rounded) : nullptr;
    if (rounded && !p) throw std::bad_alloc();
    std::shared_ptr<void> keep(p, [](void* q) { std::free(q); });
    return lease(std::move(keep), {static_cast<std::byte*>(p), size});
  }

  /// The leased bytes (valid while this lease or a copy of it lives).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return bytes_; }
  [[nodiscard]] explicit operator bool() const noexcept { return keep_ != nullptr; }
  /// Number of leases sharing these bytes.
  [[nodiscard]] long use_count() const noexcept { return keep_.use_count(); }
  /// Releases this share.
  void reset() noexcept {
    keep_.reset();
    bytes_ = {};
  }

 private:
  std::shared_ptr<void> keep_;
  std::span<std::byte> bytes_;
};

}  // namespace sluice::inline v0
