// comm::nccl_lane: pinned host windows, device windows, uploads and the
// exchange on the NCCL communicator's stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/nccl/lane.hpp>
#include <sluice/cuda/error.hpp>
#include <sluice/cuda/device_buffer.hpp>
#include <sluice/cuda/pinned.hpp>

namespace sluice::inline v0::comm {

namespace {
std::size_t rounded(std::size_t n) { return (n + (std::size_t{2} << 20) - 1) / (std::size_t{2} << 20) * (std::size_t{2} << 20); }

// The driver may call upload/exchange from a helper thread (overlapped
// windows), whose current device is 0: bind it to the lane's device first.
void bind(int device) { cuda::check(::cudaSetDevice(device), "cudaSetDevice", {fmt::format("device {} for nccl_lane", device)}); }

// A slot's memory for `n` bytes: reused while nobody else holds it and it is
// large enough, else `make(capacity)` -> (owner, data) gives fresh memory.
template <class Slot, class Make>
lease reuse_or_make(Slot& m, std::size_t n, std::uint64_t& allocations, Make make) {
  if (n == 0) return {};
  if (!m.mem || m.mem.use_count() > 1 || m.cap < n) {
    const auto cap = rounded(std::max(n, m.cap));
    auto [keep, data] = make(cap);
    m = {std::move(keep), data, cap};
    allocations += 1;
  }
  return lease(m.mem, {m.data, n});
}

void check_slot(unsigned slot) {
  if (slot >= 4) throw config_error(fmt::format("nccl_lane: slot {} (slots are 0..3)", slot));
}
}  // namespace

// Device window buffers that were replaced while a sink still held them come
// back here when the sink lets go (its reaper thread, once the copy out of
// them completed), instead of going to cudaFree: cudaFree may synchronize the
// device, stalling the exchange in flight. The lane takes them again before
// it allocates; release() frees them all, and later returns are freed at once.
struct nccl_lane::recycler {
  int device = 0;
  std::mutex mu;
  std::vector<memory::device_buffer> free;
  bool closed = false;

  // The smallest free buffer of at least `n` bytes (empty if none).
  memory::device_buffer take(std::size_t n) {
    std::lock_guard g(mu);
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->size() >= n && (best == free.end() || it->size() < best->size())) best = it;
    if (best == free.end()) return {};
    auto b = std::move(*best);
    free.erase(best);
    return b;
  }
  void give_back(memory::device_buffer* b) noexcept {
    {
      std::lock_guard g(mu);
      if (!closed) {
        try {
          free.push_back(std::move(*b));
        } catch (...) {  // no room to keep it: free it below
        }
      }
    }
    if (*b) (void)::cudaSetDevice(device);
    delete b;  // frees it unless it was kept
  }
  void close() noexcept {
    std::vector<memory::device_buffer> gone;
    {
      std::lock_guard g(mu);
      closed = true;
      gone.swap(free);
    }
    if (!gone.empty()) (void)::cudaSetDevice(device);
  }  // `gone` frees them here
};

nccl_lane::nccl_lane(nccl& c) : c_(&c), recycle_(std::make_shared<recycler>()) { recycle_->device = c.device(); }
nccl_lane::nccl_lane(nccl&& c)
    : owned_(std::make_unique<nccl>(std::move(c))), c_(owned_.get()), recycle_(std::make_shared<recycler>()) {
  recycle_->device = c_->device();
}
nccl_lane::nccl_lane(nccl_lane&&) noexcept = default;
nccl_lane& nccl_lane::operator=(nccl_lane&&) noexcept = default;

nccl_lane::~nccl_lane() { release(); }

void nccl_lane::release() noexcept {
  if (!recycle_) return;  // moved from
  // No copy or NCCL kernel may still use the buffers when they go; the wait is
  // bounded (a stream stuck on a dead peer gets its communicator aborted).
  if (c_) (void)c_->drain(c_->stream());
  for (auto& m : host_) m = {};
  for (auto& m : dev_) m = {};
  if (recycle_) recycle_->close();
}

lease nccl_lane::host_buffer(unsigned slot, std::size_t n) {
  check_slot(slot);
  // cudaHostRegister runs in the current device's context: on a helper
  // thread (current device 0) it would make one on GPU 0 and pin there.
  if (n) bind(c_->device());
  return reuse_or_make(host_[slot], n, stats_.host_allocations, [](std::size_t cap) {
    auto p = memory::pinned::allocate(cap, memory::pin_mode::host_register);
    return std::pair(p.keep(), p.data());
  });
}

lease nccl_lane::device_buffer(unsigned slot, std::size_t n) {
  check_slot(slot);
  std::uint64_t made = 0;
  auto l = reuse_or_make(dev_[slot], n, made, [&](std::size_t cap) {
    auto b = recycle_->take(cap);
    if (b) {
      stats_.device_recycled += 1;
    } else {
      b = memory::device_buffer::allocate(cap, c_->device(), fmt::format("nccl_lane window buffer {}", slot));
      stats_.device_allocations += 1;
    }
    std::byte* data = b.data();
    auto owner = std::shared_ptr<memory::device_buffer>(new memory::device_buffer(std::move(b)),
                                                        [r = recycle_](memory::device_buffer* p) { r->give_back(p); });
    return std::pair(std::shared_ptr<void>(std::move(owner)), data);
  });
  return l;
}

void nccl_lane::upload(std::span<std::byte> device_dst, std::span<const std::byte> host_src) {
  if (device_dst.size() != host_src.size())
    throw config_error(fmt::format("nccl_lane upload: {} bytes into {}", host_src.size(), device_dst.size()));
  if (host_src.empty()) return;
  if (c_->aborted()) throw comm_error("nccl_lane upload: the NCCL communicator was aborted after an earlier failure");
  bind(c_->device());
  cuda::check(::cudaMemcpyAsync(device_dst.data(), host_src.data(), host_src.size(), cudaMemcpyHostToDevice, c_->stream()),
              "cudaMemcpyAsync", {fmt::format("nccl_lane upload of {} bytes", host_src.size())});
  stats_.uploads += 1;
  stats_.uploaded_bytes += host_src.size();
}

void nccl_lane::exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) {
  bind(c_->device());
  try {
    c_->exchange(sends, recvs);  // enqueued after the uploads on the same stream; waits when it has messages
    c_->wait(c_->stream());      // and when it has none: the uploads must have landed before delivery
  } catch (...) {
    // The communicator aborted itself before throwing (its kernels exit): the
    // stream drains, so nothing after this (the driver dropping its window
    // leases, the buffers' cudaFree) waits on a dead peer. Bounded all the same.
    (void)c_->drain(c_->stream());
    throw;
  }
  stats_.exchanges += 1;
}

}  // namespace sluice::inline v0::comm
