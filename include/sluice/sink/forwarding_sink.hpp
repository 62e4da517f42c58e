#pragma once
/// \file
/// `forwarding_sink<Inner>`: the base of a sink that wraps another one (to
/// record, count or filter what passes). It forwards `accept` and every
/// optional member the inner sink has (`direct_destination`, `finish`,
/// `reserve`) and declares the inner sink's traits (`device_views`,
/// `whole_tensors`; sink_traits_of), so a wrapper overrides only what it
/// changes and loses nothing by omission. Members the inner sink lacks are
/// absent here too (they are constrained on it).
///
///     struct counting : forwarding_sink<cuda::device_sink> {
///       using forwarding_sink::forwarding_sink;
///       std::size_t n = 0;
///       bool accept(tensor_view v) { ++n; return forwarding_sink::accept(std::move(v)); }
///     };

#include <span>
#include <utility>

#include <sluice/checkpoint.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

template <sink Inner>
class forwarding_sink {
 public:
  static constexpr bool device_views = takes_device_views<Inner>();
  static constexpr bool whole_tensors = wants_whole_tensors<Inner>();

  /// Refers to `inner`, which must outlive every use of this sink.
  explicit forwarding_sink(Inner& inner) noexcept : inner_(&inner) {}

  bool accept(tensor_view v) { return inner_->accept(std::move(v)); }
  [[nodiscard]] std::span<std::byte> direct_destination(const tensor_ref& t)
    requires direct_sink<Inner>
  {
    return inner_->direct_destination(t);
  }
  void finish()
    requires requires(Inner& s) { s.finish(); }
  {
    inner_->finish();
  }
  template <class Plan, class Rank>
    requires requires(Inner& s, const Plan& p, Rank r) { s.reserve(p, r); }
  void reserve(const Plan& plan, Rank rank) {
    inner_->reserve(plan, rank);
  }
  /// The wrapped sink.
  [[nodiscard]] Inner& inner() const noexcept { return *inner_; }

 private:
  Inner* inner_;
};

}  // namespace sluice::inline v0
