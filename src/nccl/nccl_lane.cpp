// comm::nccl_lane: pinned host windows, device windows, uploads and the
// exchange on the NCCL communicator's stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include <sluice/comm/nccl_lane.hpp>
#include <sluice/cuda/error.hpp>
#include <sluice/memory/device.hpp>
#include <sluice/memory/pinned.hpp>

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

nccl_lane::nccl_lane(nccl& c) : c_(&c) {}
nccl_lane::nccl_lane(nccl_lane&&) noexcept = default;
nccl_lane& nccl_lane::operator=(nccl_lane&&) noexcept = default;

nccl_lane::~nccl_lane() {
  if (c_) (void)::cudaStreamSynchronize(c_->stream());  // no copy may still read or write the buffers
}

lease nccl_lane::host_buffer(unsigned slot, std::size_t n) {
  check_slot(slot);
  return reuse_or_make(host_[slot], n, stats_.host_allocations, [](std::size_t cap) {
    auto p = memory::pinned::allocate(cap);
    return std::pair(p.keep(), p.data());
  });
}

lease nccl_lane::device_buffer(unsigned slot, std::size_t n) {
  check_slot(slot);
  return reuse_or_make(dev_[slot], n, stats_.device_allocations, [&](std::size_t cap) {
    auto b = std::make_shared<memory::device_buffer>(
        memory::device_buffer::allocate(cap, c_->device(), fmt::format("nccl_lane window buffer {}", slot)));
    std::byte* data = b->data();
    return std::pair(std::shared_ptr<void>(std::move(b)), data);
  });
}

void nccl_lane::upload(std::span<std::byte> device_dst, std::span<const std::byte> host_src) {
  if (device_dst.size() != host_src.size())
    throw config_error(fmt::format("nccl_lane upload: {} bytes into {}", host_src.size(), device_dst.size()));
  if (host_src.empty()) return;
  bind(c_->device());
  cuda::check(::cudaMemcpyAsync(device_dst.data(), host_src.data(), host_src.size(), cudaMemcpyHostToDevice, c_->stream()),
              "cudaMemcpyAsync", {fmt::format("nccl_lane upload of {} bytes", host_src.size())});
  stats_.uploads += 1;
  stats_.uploaded_bytes += host_src.size();
}

void nccl_lane::exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) {
  bind(c_->device());
  c_->exchange(sends, recvs);  // enqueued after the uploads on the same stream; waits when it has messages
  c_->wait(c_->stream());      // and when it has none: the uploads must have landed before delivery
  stats_.exchanges += 1;
}

}  // namespace sluice::inline v0::comm
