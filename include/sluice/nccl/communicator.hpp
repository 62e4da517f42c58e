#pragma once
/// \file
/// `comm::nccl`: collectives over device memory (the sluice::nccl component;
/// NCCL's header stays in src/nccl). It models `communicator` with spans that
/// point to DEVICE memory (never touch them on the host): the exchange stage
/// (distributed/exchange_window.hpp) moves device tensors through it, by
/// comm::nccl_lane, and host ones through a host communicator (gloo, local).
///
/// Rendezvous: rank 0 makes a unique id (ncclGetUniqueId, works without a
/// GPU) and the others receive it either through a host communicator's
/// broadcast (`connect(host, opt)`) or through the rank's store
/// (`connect(rank_info, opt)`: the file `<store_dir>/sluice-nccl-id`, written
/// atomically, or with SLUICE_STORE=redis://HOST:PORT/PREFIX the Redis key
/// `PREFIX/sluice-nccl-id`). The communicator is created non-blocking, and every wait —
/// init and each collective — is bounded by `timeout`: a dead or stalled
/// peer, or an asynchronous NCCL error, aborts the communicator (ncclCommAbort,
/// which stops its kernels) where it is detected, before anything else waits
/// on its stream, and throws comm_error; it never hangs. An aborted
/// communicator refuses further collectives (comm_error); make a new one.
/// Waits poll with a back-off (20 to 200 µs), leaving the core to other work.
///
/// Large broadcasts are cut into `chunk_bytes` pieces (NCCL pipelines them;
/// the caller can overlap its own copies on other streams). The blocking
/// calls below enqueue on the communicator's stream and wait; the `_async`
/// forms enqueue on a stream the caller gives and return.

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include <sluice/comm/concepts.hpp>
#include <sluice/comm/store.hpp>

namespace sluice::inline v0::comm {

/// An NCCL call failed. `call()` names it, `code()` is its ncclResult_t.
class nccl_error : public comm_error {
 public:
  nccl_error(std::string call, int code, std::string detail, error_context ctx = {})
      : comm_error(call + " failed: " + detail, std::move(ctx)), call_(std::move(call)), code_(code) {}
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  std::string call_;
  int code_;
};

struct nccl_options {
  int device = 0;                               ///< this rank's CUDA device
  std::chrono::milliseconds timeout{60000};     ///< rendezvous, init and every collective
  std::size_t chunk_bytes = std::size_t{64} << 20;  ///< broadcast piece size
  /// The peers' liveness, asked between the polls of a pending operation:
  /// an exception it throws aborts the communicator (its kernels exit) and
  /// is rethrown, so a dead peer ends a wait within moments instead of at
  /// `timeout`. E.g. comm::gloo::liveness() of the ranks' host communicator
  /// (comm::peer_lost). Empty: only the timeout.
  std::function<void()> liveness;
};

class nccl {
 public:
  using unique_id = std::array<std::byte, 128>;  ///< NCCL_UNIQUE_ID_BYTES

  /// A fresh id (ncclGetUniqueId). Throws nccl_error.
  [[nodiscard]] static unique_id make_unique_id();
  /// Rank 0 makes the id, every rank gets it through `host.broadcast`.
  template <communicator Host>
  [[nodiscard]] static unique_id exchange_id(Host& host) {
    unique_id id{};
    if (host.rank() == 0) id = make_unique_id();
    host.broadcast(std::span<std::byte>(id), 0);
    return id;
  }
  /// Rank 0 makes the id and writes `<who.store_dir>/sluice-nccl-id` (with
  /// who.store = redis://HOST:PORT/PREFIX: SETs the key `PREFIX/sluice-nccl-id`);
  /// the others wait for it (up to who.timeout). Throws config_error (no
  /// store), comm_error (timeout, Redis unreachable), io_error. The file stays: connect(who)
  /// removes it; a caller of this one removes it (id_path) when all have read it.
  /// A file left by an earlier run may be read as this run's id: give each
  /// run a fresh store directory, or use connect(who).
  [[nodiscard]] static unique_id exchange_id(const rank_info& who);
  /// The id file of exchange_id(who): `<store_dir>/sluice-nccl-id`.
  [[nodiscard]] static std::string id_path(const rank_info& who);

  /// Joins the communicator `id` as `rank` of `size`. Throws cuda_error
  /// (cudaSetDevice, e.g. no driver) or nccl_error / comm_error.
  nccl(std::size_t rank, std::size_t size, const unique_id& id, nccl_options opt = {});
  template <communicator Host>
  [[nodiscard]] static nccl connect(Host& host, nccl_options opt = {}) {
    return nccl(host.rank(), host.size(), exchange_id(host), opt);
  }
  /// Through the rank's store (exchange_id(who)); the timeout is who.timeout.
  /// Rank 0 removes the id (file or key) once its communicator is made (every
  /// rank has read the id then: init needs them all) or has failed, so that a
  /// later run in the same store cannot read a stale id and time out.
  [[nodiscard]] static nccl connect(const rank_info& who, nccl_options opt = {});
  nccl(nccl&&) noexcept;
  nccl& operator=(nccl&&) noexcept;
  /// Destroys the communicator (aborts it if a collective failed).
  ~nccl();

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] cudaStream_t stream() const noexcept;
  /// The CUDA device of this rank (nccl_options::device).
  [[nodiscard]] int device() const noexcept;
  /// The bound of every wait (nccl_options::timeout).
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept;

  /// Aborts the communicator now (ncclCommAbort: its kernels exit, streams
  /// waiting on them drain). Idempotent; later collectives throw comm_error.
  void abort() noexcept;
  /// Whether the communicator was aborted (by abort() or after a failure).
  [[nodiscard]] bool aborted() const noexcept;
  /// Waits for `s` without throwing, for at most the timeout; if it is still
  /// busy then, aborts the communicator and waits at most one timeout more.
  /// True when `s` has drained without error. For destructors and error paths.
  bool drain(cudaStream_t s) noexcept;

  // communicator (blocking; spans are device memory)
  void broadcast(std::span<std::byte> device_buf, std::size_t root);
  void all_gather(std::span<const std::byte> device_in, std::span<std::byte> device_out);
  void all_gather_v(std::span<std::byte> device_buf, std::span<const std::size_t> counts);
  /// ncclSend/ncclRecv in one group. NCCL pairs a peer's sends with our
  /// receives by the order they are issued, not by tag: both ends must list
  /// their messages to each other in the same order (the driver's tag order).
  void exchange(std::span<const send_message> device_sends, std::span<const recv_message> device_recvs);
  void barrier();

  /// Enqueues a chunked broadcast on `s`; returns without waiting.
  void broadcast_async(std::span<std::byte> device_buf, std::size_t root, cudaStream_t s);
  /// Waits for `s` (bounded by the timeout; aborts the communicator on expiry
  /// or on an asynchronous error, then throws comm_error / nccl_error).
  void wait(cudaStream_t s);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::size_t rank_ = 0;
  std::size_t size_ = 1;
};

static_assert(communicator<nccl>);

}  // namespace sluice::inline v0::comm
