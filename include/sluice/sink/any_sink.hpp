#pragma once
/// \file
/// `any_sink`: a non-owning, type-erased reference to any sink.
///
/// The blocking loads (`load()` for files and S3) are compiled once, into the
/// library, over `any_sink`: an engine's translation unit then instantiates
/// no coroutine pipeline of its own, whatever its sink type. The cost is one
/// indirect call per view (a view is a tensor or a piece of one: megabytes),
/// nothing per byte. `any_sink` is itself a sink with every optional member:
/// `direct_destination` returns an empty span (stage it) for a sink without
/// one, `finish` does nothing for a sink without one, and `traits()` carries
/// the sink's compile-time traits as a value (sink_traits: device_views,
/// whole_tensors). A distributed load with a device lane checks
/// `traits().device_views` before any read (an erased sink cannot be checked
/// at compile time), naming the sink's type (`name()`).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <typeinfo>

#include <boost/core/demangle.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

namespace policy {
struct load_plan;
}  // namespace policy

class any_sink {
 public:
  /// Refers to `s`, which must outlive every use of this any_sink.
  template <sink S>
    requires(!std::same_as<S, any_sink>)
  any_sink(S& s) noexcept  // NOLINT(google-explicit-constructor): a sink converts where a sink is expected
      : self_(&s),
        accept_([](void* p, tensor_view v) { return static_cast<S*>(p)->accept(std::move(v)); }),
        direct_([](void* p, const tensor_ref& t) -> std::span<std::byte> {
          if constexpr (direct_sink<S>)
            return static_cast<S*>(p)->direct_destination(t);
          else
            return {};
        }),
        finish_([](void* p) {
          if constexpr (requires(S& x) { x.finish(); }) static_cast<S*>(p)->finish();
        }),
        reserve_([](void* p, const policy::load_plan& plan, std::uint32_t rank) {
          if constexpr (requires(S& x) { x.reserve(plan, rank); }) static_cast<S*>(p)->reserve(plan, rank);
        }),
        traits_(sink_traits_of<S>()),
        type_(&typeid(S)) {}

  bool accept(tensor_view v) { return accept_(self_, std::move(v)); }
  /// The sink's destination for `t`, or an empty span (the tensor is staged).
  [[nodiscard]] std::span<std::byte> direct_destination(const tensor_ref& t) { return direct_(self_, t); }
  /// Calls the sink's finish(), if it has one.
  void finish() { finish_(self_); }
  /// Calls the sink's reserve(plan, rank), if it has one (a distributed load
  /// calls it once, before any read).
  void reserve(const policy::load_plan& plan, std::uint32_t rank) { reserve_(self_, plan, rank); }
  /// The sink's traits (its compile-time declarations, as values).
  [[nodiscard]] sink_traits traits() const noexcept { return traits_; }
  /// Whether the sink wants whole tensors (its `whole_tensors`).
  [[nodiscard]] bool whole_tensors() const noexcept { return traits_.whole_tensors; }
  /// The sink's type, demangled (for error messages).
  [[nodiscard]] std::string name() const { return boost::core::demangle(type_->name()); }

 private:
  void* self_;
  bool (*accept_)(void*, tensor_view);
  std::span<std::byte> (*direct_)(void*, const tensor_ref&);
  void (*finish_)(void*);
  void (*reserve_)(void*, const policy::load_plan&, std::uint32_t);
  sink_traits traits_;
  const std::type_info* type_;
};

static_assert(direct_sink<any_sink>);

}  // namespace sluice::inline v0
