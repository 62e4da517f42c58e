#pragma once
/// \file
/// The stage concept: a typed transformation from one channel to another.

#include <concepts>

#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>

namespace sluice::inline v0 {

/// A stage reads `input_type`s from one channel and writes `output_type`s to
/// another, returning when its input is exhausted. It does not close its
/// output: whoever runs it does (so errors and end of stream are told apart).
template <class S>
concept pipeline_stage = std::move_constructible<S> && requires {
  typename S::input_type;
  typename S::output_type;
} && requires(S& s, channel<typename S::input_type>& in, channel<typename S::output_type>& out) {
  { s.run(in, out) } -> std::same_as<task<void>>;
};

/// Stages derive from this to compose with `|` (see pipeline.hpp).
struct pipeable {};

}  // namespace sluice::inline v0
