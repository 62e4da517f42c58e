#pragma once
/// \file
/// `device_lane`: device memory and its transport (NCCL), for the tensors a
/// distributed load places on the device. The distributed driver reads a
/// rank's slices into the lane's host memory (pinned, for fast H2D copies),
/// `upload`s what it keeps or sends into the lane's device memory, runs the
/// lane's `exchange`, and hands the sink `view_kind::device` views of that
/// memory. Tensors for host memory travel over the host communicator.

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>

#include <sluice/comm/concepts.hpp>
#include <sluice/memory/lease.hpp>

namespace sluice::inline v0 {

/// Device memory and its transport, for the tensors a distributed load
/// places on the device (`policy::destination::device`):
/// - `host_buffer(slot, n)`: host memory (pinned) the rank's reads land in;
/// - `device_buffer(slot, n)`: lane memory the exchange moves and the sink
///   sees (`view_kind::device` views hold its lease);
/// - `upload(dst, src)`: copies host bytes into lane memory (may be
///   asynchronous, but ordered before the next `exchange`);
/// - `exchange(sends, recvs)`: the window's point-to-point messages between
///   lane buffers; returns when every upload and message has completed.
/// Slots: 0..3 (window parity x kept/scratch), which a lane may use to size
/// what it keeps; memory is reused by the one rule of memory/recycler.hpp
/// (never while anyone holds its lease: a sink that keeps views gets other
/// memory). Optionally:
/// - `pin(host, keep)`: makes host memory the load's uploads read from
///   (the node window, which every local rank maps) fast to upload (the NCCL
///   lane registers it with CUDA once per load and process) until the
///   returned lease goes; `keep` keeps that memory alive meanwhile. A lane
///   without it uploads from such memory as it is.
/// Implementations: comm::nccl_lane (CUDA + NCCL),
/// testing::emulated_device_lane (host memory, any host communicator: tests).
///
/// Threads. A distributed load makes the calls from two threads, each pair
/// from one stage of its window pipeline:
/// - `host_buffer` and `device_buffer` from the driver's thread (the thread
///   that called load_distributed), in read_window, as it lays out window w;
/// - `upload` and `exchange` from the exchange stage's thread (its own
///   long-lived thread when the windows overlap, else the driver's), in
///   exchange_window, one window at a time, in window order.
/// The two pairs may run at the same time for different windows: while
/// window w travels (slots of parity w % 2), the driver lays out window w+1
/// (the other parity's slots); a window's buffers are allocated before any
/// of its uploads. So an implementation keeps each slot's state apart and
/// makes what the pairs share thread-safe (both lanes: their recyclers, whose
/// buffers come back on whichever thread lets go, under a mutex; the emulated
/// lane: its pinned ranges too; comm::nccl_lane: the device bound on each
/// thread that calls it).
template <class L>
concept device_lane = requires(L& l, unsigned slot, std::size_t n, std::span<std::byte> dst, std::span<const std::byte> src,
                               std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) {
  { l.host_buffer(slot, n) } -> std::same_as<lease>;
  { l.device_buffer(slot, n) } -> std::same_as<lease>;
  l.upload(dst, src);
  l.exchange(sends, recvs);
};

/// Whether lane L has the optional `pin` (see device_lane).
template <class L>
concept pinning_lane = requires(L& l, std::span<std::byte> host, std::shared_ptr<void> keep) {
  { l.pin(host, keep) } -> std::same_as<lease>;
};

/// No device lane: every tensor travels in host memory over the host communicator.
struct no_device_lane {
  lease host_buffer(unsigned, std::size_t) { return {}; }
  lease device_buffer(unsigned, std::size_t) { return {}; }
  void upload(std::span<std::byte>, std::span<const std::byte>) {}
  void exchange(std::span<const comm::send_message>, std::span<const comm::recv_message>) {}
};
static_assert(device_lane<no_device_lane>);

/// A device lane behind a virtual interface: what the compiled distributed
/// driver takes (one indirect call per window buffer, upload and exchange),
/// so that it is compiled once, not once per lane type. Same contract, and
/// the same threads, as the lane it refers to.
class any_device_lane {
 public:
  virtual ~any_device_lane() = default;
  virtual lease host_buffer(unsigned slot, std::size_t n) = 0;
  virtual lease device_buffer(unsigned slot, std::size_t n) = 0;
  virtual void upload(std::span<std::byte> dst, std::span<const std::byte> src) = 0;
  virtual void exchange(std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) = 0;
  /// device_lane's optional `pin`; by default nothing is pinned.
  virtual lease pin(std::span<std::byte> host, std::shared_ptr<void> keep) {
    (void)host, (void)keep;
    return {};
  }
};
static_assert(device_lane<any_device_lane>);

/// Refers to a lane of type L as an any_device_lane (L must outlive it).
template <device_lane L>
class device_lane_ref final : public any_device_lane {
 public:
  explicit device_lane_ref(L& lane) noexcept : l_(&lane) {}
  lease host_buffer(unsigned slot, std::size_t n) override { return l_->host_buffer(slot, n); }
  lease device_buffer(unsigned slot, std::size_t n) override { return l_->device_buffer(slot, n); }
  void upload(std::span<std::byte> dst, std::span<const std::byte> src) override { l_->upload(dst, src); }
  void exchange(std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) override {
    l_->exchange(sends, recvs);
  }
  lease pin(std::span<std::byte> host, std::shared_ptr<void> keep) override {
    if constexpr (pinning_lane<L>)
      return l_->pin(host, std::move(keep));
    else
      return any_device_lane::pin(host, std::move(keep));
  }

 private:
  L* l_;
};

}  // namespace sluice::inline v0
