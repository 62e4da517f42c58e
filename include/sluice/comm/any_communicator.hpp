#pragma once
/// \file
/// `any_communicator`: a communicator behind a virtual interface, and the
/// registry through which a communicator component offers multi-rank worlds.
///
/// The tool-level distributed load (distributed/world.hpp) joins the world a
/// `rank_info` describes: one rank needs nothing; more need the component
/// that registered itself here (sluice::gloo, when the program links it:
/// src/gloo/register.cpp).
/// So what a program can do depends on what it links, never on what it
/// includes or on a macro inside a header template (which would differ
/// between translation units).

#include <cstddef>
#include <concepts>
#include <functional>
#include <memory>
#include <span>
#include <utility>

#include <sluice/comm/concepts.hpp>
#include <sluice/comm/store.hpp>

namespace sluice::inline v0::comm {

class any_communicator {
 public:
  virtual ~any_communicator() = default;
  [[nodiscard]] virtual std::size_t rank() const noexcept = 0;
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  virtual void broadcast(std::span<std::byte> buf, std::size_t root) = 0;
  virtual void all_gather(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  virtual void all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) = 0;
  virtual void exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) = 0;
  virtual void barrier() = 0;
  /// The peers' liveness signal, for another transport among the same ranks
  /// (nccl_options::liveness): throws comm::peer_lost once a peer is known
  /// dead; empty where the communicator has no such signal.
  [[nodiscard]] virtual std::function<void()> liveness() const { return {}; }
};
static_assert(communicator<any_communicator>);

/// The liveness signal of `c` (see any_communicator::liveness): its
/// `liveness()` where it has one (comm::gloo, any_communicator), else empty
/// (comm::local: no peers to lose).
template <communicator C>
[[nodiscard]] std::function<void()> liveness_of(const C& c) {
  if constexpr (requires { { c.liveness() } -> std::convertible_to<std::function<void()>>; })
    return c.liveness();
  else
    return {};
}

/// Owns a communicator of type C behind any_communicator.
template <communicator C>
class communicator_holder final : public any_communicator {
 public:
  template <class... Args>
  explicit communicator_holder(Args&&... args) : c_(std::forward<Args>(args)...) {}
  [[nodiscard]] std::size_t rank() const noexcept override { return c_.rank(); }
  [[nodiscard]] std::size_t size() const noexcept override { return c_.size(); }
  void broadcast(std::span<std::byte> buf, std::size_t root) override { c_.broadcast(buf, root); }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) override { c_.all_gather(in, out); }
  void all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) override { c_.all_gather_v(buf, counts); }
  void exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) override { c_.exchange(sends, recvs); }
  void barrier() override { c_.barrier(); }
  [[nodiscard]] std::function<void()> liveness() const override { return liveness_of(c_); }
  [[nodiscard]] C& get() noexcept { return c_; }

 private:
  C c_;
};

/// Refers to a communicator of type C as an any_communicator (C must outlive
/// it): how the typed front ends hand theirs to the compiled driver.
template <communicator C>
class communicator_ref final : public any_communicator {
 public:
  explicit communicator_ref(C& c) noexcept : c_(&c) {}
  [[nodiscard]] std::size_t rank() const noexcept override { return c_->rank(); }
  [[nodiscard]] std::size_t size() const noexcept override { return c_->size(); }
  void broadcast(std::span<std::byte> buf, std::size_t root) override { c_->broadcast(buf, root); }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) override { c_->all_gather(in, out); }
  void all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts) override { c_->all_gather_v(buf, counts); }
  void exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) override { c_->exchange(sends, recvs); }
  void barrier() override { c_->barrier(); }
  [[nodiscard]] std::function<void()> liveness() const override { return liveness_of(*c_); }

 private:
  C* c_;
};

/// Joins the world `who` describes (blocks until every rank arrived).
using world_factory = std::function<std::unique_ptr<any_communicator>(const rank_info& who)>;

/// Registers the communicator that multi-rank worlds use (the last one
/// registered wins). Returns true, for static initialisers.
bool register_world(world_factory join);

/// Joins the world of `who` through the registered communicator; throws
/// missing_component_error naming sluice::gloo when none was registered (a
/// multi-rank load in a program that does not link it).
[[nodiscard]] std::unique_ptr<any_communicator> join_world(const rank_info& who);

}  // namespace sluice::inline v0::comm
