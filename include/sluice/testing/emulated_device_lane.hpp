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
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/memory/recycler.hpp>
#include <sluice/error.hpp>
#include <sluice/comm/device_lane.hpp>

namespace sluice::inline v0::testing {

template <comm::communicator Comm>
class emulated_device_lane {
 public:
  /// The byte lane memory is filled with when handed out.
  static constexpr std::byte poison{0xa5};

  explicit emulated_device_lane(Comm& c) : c_(&c), host_(heap{pinned_}) {}
  emulated_device_lane(const emulated_device_lane&) = delete;
  emulated_device_lane& operator=(const emulated_device_lane&) = delete;
  ~emulated_device_lane() { release(); }

  lease host_buffer(unsigned slot, std::size_t n) { return host_.get(slot, n); }
  lease device_buffer(unsigned slot, std::size_t n) {
    auto l = device_.get(slot, n);
    if (n) std::memset(l.bytes().data(), static_cast<int>(poison), n);
    return l;
  }
  void upload(std::span<std::byte> dst, std::span<const std::byte> src) {
    if (dst.size() != src.size()) throw config_error(fmt::format("emulated lane upload: {} bytes into {}", src.size(), dst.size()));
    if (aborted_) throw comm::comm_error("emulated lane upload: the lane was aborted after an earlier failure");
    if (src.empty()) return;
    if (!pinned_->holds(src)) unpinned_ += src.size();
    pending_.emplace_back(dst, src);
  }
  /// As comm::nccl_lane's: `host` counts as pinned until the lease goes.
  lease pin(std::span<std::byte> host, std::shared_ptr<void> keep) {
    if (host.empty()) return {};
    pinned_->add(host.data(), host.size());
    pins_ += 1;
    auto ranges = pinned_;
    std::shared_ptr<void> unpin(host.data(), [ranges, keep = std::move(keep)](void* p) mutable noexcept {
      ranges->remove(p);
      keep.reset();
    });
    return lease(std::move(unpin), host);
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
    host_.all().release();
    device_.all().release();
  }

  [[nodiscard]] std::uint64_t uploads() const noexcept { return uploads_; }
  [[nodiscard]] std::uint64_t uploaded_bytes() const noexcept { return uploaded_; }
  [[nodiscard]] std::uint64_t exchanges() const noexcept { return exchanges_; }
  /// Bytes uploaded from host memory that was neither the lane's (pinned)
  /// host buffers nor pinned with pin(): what would upload at pageable speed.
  [[nodiscard]] std::uint64_t unpinned_upload_bytes() const noexcept { return unpinned_; }
  /// Calls of pin() with memory.
  [[nodiscard]] std::uint64_t pins() const noexcept { return pins_; }
  /// Whether an exchange failed (the lane then refuses further work).
  [[nodiscard]] bool aborted() const noexcept { return aborted_; }
  /// Bytes of lane memory (host and device buffers) allocated right now
  /// (lent, or idle in the lane's recyclers).
  [[nodiscard]] std::size_t live_bytes() const { return host_.all().stats().live_bytes + device_.all().stats().live_bytes; }

 private:
  // The host memory that counts as pinned: the lane's host buffers and what
  // pin() was given (start -> size). Shared with the buffers' recycler, which
  // frees on any thread.
  struct pinned_ranges {
    std::mutex mu;
    std::map<const std::byte*, std::size_t> at;
    void add(const void* p, std::size_t n) {
      std::lock_guard g(mu);
      at[static_cast<const std::byte*>(p)] = n;
    }
    void remove(const void* p) noexcept {
      std::lock_guard g(mu);
      at.erase(static_cast<const std::byte*>(p));
    }
    bool holds(std::span<const std::byte> b) {
      std::lock_guard g(mu);
      auto it = at.upper_bound(b.data());
      if (it == at.begin()) return false;
      --it;
      return b.data() + b.size() <= it->first + it->second;
    }
  };
  // Heap memory, by the one reuse rule (memory/recycler.hpp), as comm::nccl_lane's;
  // `pinned`: where host buffers are noted as pinned (none for device memory).
  struct heap {
    std::shared_ptr<pinned_ranges> pinned;
    std::size_t capacity_for(std::size_t n) const noexcept { return (n + 4095) / 4096 * 4096; }
    void* allocate(std::size_t cap) const {
      void* p = std::aligned_alloc(4096, cap);
      if (!p) throw std::bad_alloc();
      if (pinned) pinned->add(p, cap);
      return p;
    }
    void free(void* p, std::size_t) const noexcept {
      if (pinned) pinned->remove(p);
      std::free(p);
    }
  };
  Comm* c_;
  std::shared_ptr<pinned_ranges> pinned_ = std::make_shared<pinned_ranges>();
  memory::slot_recycler<heap, 4> host_, device_;
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> pending_;
  std::uint64_t uploads_ = 0, uploaded_ = 0, exchanges_ = 0, unpinned_ = 0, pins_ = 0;
  bool aborted_ = false;
};

}  // namespace sluice::inline v0::testing
