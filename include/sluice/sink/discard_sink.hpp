#pragma once
/// \file
/// A sink that only counts (for tools and benchmarks).

#include <cstdint>

#include <sluice/sink/concepts.hpp>

namespace sluice::inline v0 {

class discard_sink {
 public:
  static constexpr bool device_views = true;  ///< counts any view, never reads its bytes
  bool accept(tensor_view v) noexcept {
    bytes_ += v.bytes.size();
    if (v.last()) ++tensors_;
    return true;
  }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::uint64_t tensors() const noexcept { return tensors_; }

 private:
  std::uint64_t bytes_ = 0, tensors_ = 0;
};

static_assert(sink<discard_sink>);

}  // namespace sluice::inline v0
