#pragma once
/// \file
/// `testing::emulated_device_lane`: a `device_lane` in host memory over any
/// host communicator, so that the device path of a distributed load (upload,
/// exchange between lane buffers, `view_kind::device` delivery) runs and is
/// tested where there is no GPU. It behaves like the NCCL lane where it
/// matters for correctness: lane memory is separate from the host buffers the
/// reads land in (and poisoned when handed out, so a byte neither uploaded nor
/// received shows up as a wrong digest), and uploads are deferred to the
/// next `exchange`, as copies enqueued on a stream are (so a host buffer
/// changed after `upload` and before `exchange` shows up too). The views it
/// yields are host memory: a test sink may read them; a real device lane's
/// must not be read on the host.
///
/// Failure, as comm::nccl_lane: an exchange that throws (a dead peer: the host
/// communicator's timeout) leaves the lane aborted — later uploads and
/// exchanges throw comm_error — and `release()` (the destructor) drops its
/// memory; `live_bytes()` counts lane memory still allocated, held by the
/// lane or by anyone holding a lease, so a test can see that a failed load
/// let go of everything.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/core/lease.hpp>
#include <sluice/error.hpp>
#include <sluice/comm/device_lane.hpp>

namespace sluice::inline v0::testing {

template <comm::communicator Comm>
class emulated_device_lane {
 public:
  /// The byte lane memory is filled with when handed out.
  static constexpr std::byte poison{0xa5};

  explicit emulated_device_lane(Comm& c) : c_(&c) {}
  emulated_device_lane(const emulated_device_lane&) = delete;
  emulated_device_lane& operator=(const emulated_device_lane&) = delete;
  ~emulated_device_lane() { release(); }

  lease host_buffer(unsigned slot, std::size_t n) { return host_.at(slot).get(n, live_); }
  lease device_buffer(unsigned slot, std::size_t n) {
    auto l = device_.at(slot).get(n, live_);
    if (n) std::memset(l.bytes().data(), static_cast<int>(poison), n);
    return l;
  }
  void upload(std::span<std::byte> dst, std::span<const std::byte> src) {
    if (dst.size() != src.size()) throw config_error(fmt::format("emulated lane upload: {} bytes into {}", src.size(), dst.size()));
    if (aborted_) throw comm::comm_error("emulated lane upload: the lane was aborted after an earlier failure");
    if (!src.empty()) pending_.emplace_back(dst, src);
  }
  void exchange(std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) {
    if (aborted_) throw comm::comm_error("emulated lane exchange: the lane was aborted after an earlier failure");
    for (const auto& [dst, src] : pending_) std::memcpy(dst.data(), src.data(), src.size()), uploaded_ += src.size();
    uploads_ += pending_.size();
    pending_.clear();
    try {
      c_->exchange(sends, recvs);
    } catch (...) {
      aborted_ = true;  // where comm::nccl_lane's communicator aborts itself, before anything waits on it
      throw;
    }
    exchanges_ += 1;
  }
  /// Drops the lane's own references to its memory (what a sink still holds goes when it lets go).
  void release() noexcept {
    pending_.clear();
    for (auto& b : host_) b = {};
    for (auto& b : device_) b = {};
  }

  [[nodiscard]] std::uint64_t uploads() const noexcept { return uploads_; }
  [[nodiscard]] std::uint64_t uploaded_bytes() const noexcept { return uploaded_; }
  [[nodiscard]] std::uint64_t exchanges() const noexcept { return exchanges_; }
  /// Whether an exchange failed (the lane then refuses further work).
  [[nodiscard]] bool aborted() const noexcept { return aborted_; }
  /// Bytes of lane memory (host and device buffers) allocated right now.
  [[nodiscard]] std::size_t live_bytes() const noexcept { return live_->load(); }

 private:
  // detail::window_buffer's reuse rule (reused while nobody else holds it and
  // large enough), with the memory counted in `live` until its last holder goes.
  struct buffer {
    std::shared_ptr<void> mem;
    std::size_t cap = 0;
    lease get(std::size_t n, const std::shared_ptr<std::atomic<std::size_t>>& live) {
      if (n == 0) return {};
      if (!mem || mem.use_count() > 1 || cap < n) {
        const std::size_t c = (std::max(n, cap) + 4095) / 4096 * 4096;
        void* p = std::aligned_alloc(4096, c);
        if (!p) throw std::bad_alloc();
        live->fetch_add(c);
        mem = std::shared_ptr<void>(p, [live, c](void* q) {
          std::free(q);
          live->fetch_sub(c);
        });
        cap = c;
      }
      return lease(mem, {static_cast<std::byte*>(mem.get()), n});
    }
  };

  Comm* c_;
  std::shared_ptr<std::atomic<std::size_t>> live_ = std::make_shared<std::atomic<std::size_t>>(0);
  std::array<buffer, 4> host_, device_;
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> pending_;
  std::uint64_t uploads_ = 0, uploaded_ = 0, exchanges_ = 0;
  bool aborted_ = false;
};

}  // namespace sluice::inline v0::testing
