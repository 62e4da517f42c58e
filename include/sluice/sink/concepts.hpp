#pragma once
/// \file
/// Sinks: where the place stage puts tensors.
///
/// A sink's `accept(view)` takes a view (a whole tensor, an ordered piece, a
/// direct-placed tensor, a metadata-only probe view or a distributed
/// placeholder: `tensor_view::carries_data()` is false for the last two) and
/// returns false when it declines the tensor. It may keep the view (and so its lease) as long as
/// it needs the bytes; the slot is reused only after the last lease is gone.
/// Optional members:
/// - `std::span<std::byte> direct_destination(const tensor_ref&)`: a non-empty
///   span makes the loader read the tensor straight into it (no staging copy);
/// - `static constexpr bool whole_tensors`: deliver each tensor whole (the
///   stage assembles multi-piece tensors) instead of as ordered pieces;
/// - `void finish()`: called once after the last view;
/// - `void reserve(const policy::load_plan&, policy::rank_t)`: called by a
///   distributed load once the ranks agree on the plan, before any read (a
///   device sink reserves its tensors' memory at their part sizes, once);
/// - `static constexpr bool device_views`: it takes a device lane's views.
/// Their values are its traits (`sink_traits_of`). A wrapper that forwards to
/// another sink derives from `forwarding_sink` (sink/forwarding_sink.hpp) and
/// gets every one of them, and the traits, without restating them.

#include <concepts>
#include <span>
#include <string>

#include <sluice/checkpoint.hpp>
#include <sluice/error.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

template <class S>
concept sink = requires(S& s, tensor_view v) {
  { s.accept(std::move(v)) } -> std::same_as<bool>;
};

template <class S>
concept direct_sink = sink<S> && requires(S& s, const tensor_ref& t) {
  { s.direct_destination(t) } -> std::same_as<std::span<std::byte>>;
};

/// For host sinks: throws config_error for a view whose bytes are in device
/// memory (a distributed load with a device lane), which they must not read.
inline void require_host_view(const tensor_view& v, const char* sink_name) {
  if (v.kind == view_kind::device)
    throw config_error(std::string(sink_name) +
                           " got a view in device memory (the load has a device lane): use cuda::device_sink, or load without the lane",
                       {"", v.tensor ? v.tensor->name : std::string()});
}

/// Whether a sink takes `view_kind::device` views (a distributed load with a
/// device lane delivers them): a sink says so with `static constexpr bool
/// device_views = true` (cuda::device_sink). Host sinks do not, and a load
/// with a lane into one fails to compile.
template <class S>
[[nodiscard]] constexpr bool takes_device_views() noexcept {
  if constexpr (requires { S::device_views; })
    return S::device_views;
  else
    return false;
}

/// Whether a sink wants whole tensors (default: ordered pieces).
template <class S>
[[nodiscard]] constexpr bool wants_whole_tensors() noexcept {
  if constexpr (requires { S::whole_tensors; })
    return S::whole_tensors;
  else
    return false;
}

/// What a sink declares about itself, as values: whether it takes
/// `view_kind::device` views and whether it wants whole tensors. The query
/// (`sink_traits_of<S>()`) reads the sink's `static constexpr` members; a
/// wrapper that derives from forwarding_sink (sink/forwarding_sink.hpp) has its
/// inner sink's by default, and any_sink carries them as a value
/// (`any_sink::traits()`), which the distributed driver checks before any read.
struct sink_traits {
  bool device_views = false;
  bool whole_tensors = false;
  friend bool operator==(const sink_traits&, const sink_traits&) = default;
};

/// The traits sink type `S` declares (false where it declares nothing).
template <class S>
[[nodiscard]] constexpr sink_traits sink_traits_of() noexcept {
  return {takes_device_views<S>(), wants_whole_tensors<S>()};
}

}  // namespace sluice::inline v0
