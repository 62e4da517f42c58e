#pragma once
/// \file
/// A sink around an engine's weight-loader callback. The callback receives
/// each tensor whole; returning false declines it (a callback returning void
/// accepts everything). Whether it can decline is decided from its signature.

#include <concepts>
#include <type_traits>
#include <utility>

#include <sluice/sink/concepts.hpp>

namespace sluice::inline v0 {

template <class F>
concept weight_loader = std::invocable<F&, tensor_view> &&
    (std::same_as<std::invoke_result_t<F&, tensor_view>, bool> || std::same_as<std::invoke_result_t<F&, tensor_view>, void>);

template <weight_loader F>
class callback_sink {
 public:
  static constexpr bool whole_tensors = true;
  /// The callback decides what to do with a device view.
  static constexpr bool device_views = true;
  /// True when the loader can decline (returns bool).
  static constexpr bool can_decline = std::same_as<std::invoke_result_t<F&, tensor_view>, bool>;

  explicit callback_sink(F f) : f_(std::move(f)) {}

  bool accept(tensor_view v) {
    if constexpr (can_decline)
      return f_(std::move(v));
    else {
      f_(std::move(v));
      return true;
    }
  }

 private:
  F f_;
};

static_assert(sink<callback_sink<bool (*)(tensor_view)>>);

}  // namespace sluice::inline v0
