#pragma once
/// \file
/// `comm::nccl_lane`: the device lane of a distributed load (the sluice::nccl
/// component; see comm/device_lane.hpp). Tensors destined for the device are
/// read into pinned host memory, copied to the GPU with cudaMemcpyAsync on
/// the NCCL communicator's stream, and exchanged between the ranks' device
/// window buffers with ncclSend/ncclRecv in one group on that same stream
/// (so every upload is ordered before the messages that carry it); `exchange`
/// returns when the stream has drained, bounded by the communicator's timeout.
/// The sink then gets `view_kind::device` views of the window buffer
/// (cuda::device_sink copies them device-to-device into their destinations).
/// A dead peer: the exchange throws comm_error within the timeout, the
/// communicator already aborted (its kernels stopped) and the stream drained,
/// so unwinding frees the buffers without waiting on the peer.
///
/// Memory: pinned host buffers (the staging pool's pin mode: pages of an
/// ordinary mapping registered with cudaHostRegister, so O_DIRECT reads land
/// in them on any driver) and device buffers, a window's kept and scratch
/// regions each as large as the largest window needs (about
/// `plan_options::window_bytes` per rank for kept, its reads-for-others for
/// scratch), lent by the one reuse rule (memory/recycler.hpp): a buffer a
/// sink still holds a view into is not handed out again, and comes back to
/// the lane when the sink lets go (not cudaFree, which may synchronize the
/// device while an exchange is in flight). Errors: cuda::cuda_error naming the call,
/// nccl_error / comm_error from the exchange.
///
///   const int device = cuda::device_for_local_rank(local_rank);
///   auto dev = comm::nccl::connect(host_comm, {.device = device});
///   comm::nccl_lane lane(dev);
///   cuda::device_sink sink({.device = device});
///   load_distributed(ck, host_comm, plan, sink, opt, lane);
///
/// With the tool-level call, which joins the world itself, the lane is made
/// once the world is joined, so that NCCL hears of a dead peer through the
/// host communicator's liveness signal:
///
///   load_distributed(where, topology, offload, who, sink, opt, open, [&](auto& host) {
///     return comm::nccl_lane(comm::nccl::connect(who, {.device = device, .liveness = comm::liveness_of(host)}));
///   });

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include <sluice/nccl/communicator.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/comm/device_lane.hpp>

namespace sluice::inline v0::comm {

struct nccl_lane_stats {
  std::uint64_t uploads = 0;             ///< cudaMemcpyAsync host -> device
  std::uint64_t uploaded_bytes = 0;
  std::uint64_t exchanges = 0;
  std::uint64_t host_allocations = 0;    ///< pinned buffers allocated (a reused one is not counted again)
  std::uint64_t device_allocations = 0;  ///< device buffers allocated (cudaMalloc)
  std::uint64_t device_recycled = 0;     ///< device buffers handed out again once free (no cudaMalloc)
};

class nccl_lane {
 public:
  /// A lane over `c` (its device and stream); `c` must outlive the lane.
  explicit nccl_lane(nccl& c);
  /// A lane that owns its communicator (one made inside a load: the lane
  /// factory of the tool-level load_distributed); it goes with the lane,
  /// after the lane's buffers.
  explicit nccl_lane(nccl&& c);
  nccl_lane(nccl_lane&&) noexcept;
  nccl_lane& operator=(nccl_lane&&) noexcept;
  nccl_lane(const nccl_lane&) = delete;
  nccl_lane& operator=(const nccl_lane&) = delete;
  /// release().
  ~nccl_lane();
  /// Waits for the stream (bounded by the communicator's timeout, aborting it
  /// if it is stuck; errors ignored), then drops the lane's buffers (memory a
  /// sink still holds goes when the sink lets go).
  void release() noexcept;

  /// Pinned host memory for slot `slot` (0..3), `n` bytes.
  [[nodiscard]] lease host_buffer(unsigned slot, std::size_t n);
  /// Device memory (the communicator's device) for slot `slot`, `n` bytes.
  [[nodiscard]] lease device_buffer(unsigned slot, std::size_t n);
  /// Registers `host` with CUDA (cudaHostRegister, portable) until the
  /// returned lease goes, `keep` keeping it alive meanwhile: uploads from it
  /// then run at pinned speed (the node window, once per load).
  [[nodiscard]] lease pin(std::span<std::byte> host, std::shared_ptr<void> keep);
  /// Enqueues the copy of `host_src` into `device_dst` (equal sizes) on the communicator's stream.
  void upload(std::span<std::byte> device_dst, std::span<const std::byte> host_src);
  /// The window's messages (device memory), after the uploads; returns when all completed.
  void exchange(std::span<const send_message> sends, std::span<const recv_message> recvs);

  [[nodiscard]] nccl_lane_stats stats() const noexcept;

 private:
  struct buffers;
  std::unique_ptr<nccl> owned_;  // first: destroyed after everything that uses it
  nccl* c_;
  std::unique_ptr<buffers> buffers_;
  nccl_lane_stats stats_;
};

static_assert(device_lane<nccl_lane> && pinning_lane<nccl_lane>);

}  // namespace sluice::inline v0::comm
