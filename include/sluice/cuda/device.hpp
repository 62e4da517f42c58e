#pragma once
/// \file
/// Is there a CUDA device? Without a driver the runtime answers every call
/// with an error (35, cudaErrorInsufficientDriver, on the CI machines) and
/// `cudaGetDeviceCount` leaves its output unchanged: `query_devices` treats
/// any error as zero devices and keeps the reason for a skip message.
/// Also RAII stream and event handles.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include <sluice/cuda/error.hpp>

namespace sluice::inline v0::cuda {

/// The answer of cudaGetDeviceCount.
struct device_query {
  int count = 0;                    ///< 0 when the call failed
  cudaError_t status = cudaSuccess;  ///< the call's result
  /// "cudaGetDeviceCount: cudaErrorInsufficientDriver (35): ..." or "cudaGetDeviceCount: 0 devices".
  [[nodiscard]] std::string reason() const {
    if (status != cudaSuccess) return "cudaGetDeviceCount: " + describe(status);
    return "cudaGetDeviceCount: " + std::to_string(count) + " device" + (count == 1 ? "" : "s");
  }
  [[nodiscard]] explicit operator bool() const noexcept { return count > 0; }
};

/// Never throws; a failed call counts as no device.
[[nodiscard]] inline device_query query_devices() noexcept {
  device_query q;
  int n = 0;
  q.status = ::cudaGetDeviceCount(&n);
  if (q.status != cudaSuccess) {
    (void)::cudaGetLastError();
    n = 0;
  }
  q.count = n < 0 ? 0 : n;
  return q;
}

[[nodiscard]] inline int device_count() noexcept { return query_devices().count; }

/// The device a rank uses: `local_rank % count`. Local rank k of a node with n
/// visible GPUs takes GPU k % n; where each rank sees only its own GPU
/// (CUDA_VISIBLE_DEVICES set per rank) that is device 0 — `local_rank` itself
/// would name a device the rank cannot see. count <= 0 (no device, or the
/// query failed): 0, and the first CUDA call reports why.
[[nodiscard]] constexpr int device_for_local_rank(std::size_t local_rank, int count) noexcept {
  return count > 0 ? static_cast<int>(local_rank % static_cast<std::size_t>(count)) : 0;
}
/// The same with the visible devices counted (cudaGetDeviceCount).
[[nodiscard]] inline int device_for_local_rank(std::size_t local_rank) noexcept {
  return device_for_local_rank(local_rank, device_count());
}

/// A non-blocking stream (does not synchronize with the legacy default stream).
class stream {
 public:
  stream() {
    check(::cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~stream() { reset(); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  void synchronize() const { check(::cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  void reset() noexcept {
    if (s_) (void)::cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// An event; by default without timing and with blocking sync (a waiting
/// thread sleeps rather than spins).
class event {
 public:
  explicit event(unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync) {
    check(::cudaEventCreateWithFlags(&e_, flags), "cudaEventCreateWithFlags");
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~event() { reset(); }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) const { check(::cudaEventRecord(e_, s), "cudaEventRecord"); }
  void synchronize() const { check(::cudaEventSynchronize(e_), "cudaEventSynchronize"); }
  /// True when complete; throws on an error other than cudaErrorNotReady.
  [[nodiscard]] bool ready() const {
    const auto r = ::cudaEventQuery(e_);
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaEventQuery");
    return true;
  }

 private:
  void reset() noexcept {
    if (e_) (void)::cudaEventDestroy(e_);
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

}  // namespace sluice::inline v0::cuda
