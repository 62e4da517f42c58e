// comm::nccl_lane: pinned host windows, device windows, uploads and the
// exchange on the NCCL communicator's stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/nccl/lane.hpp>
#include <sluice/cuda/error.hpp>
#include <sluice/cuda/device_buffer.hpp>
#include <sluice/cuda/pinned.hpp>
#include <sluice/memory/recycler.hpp>

namespace sluice::inline v0::comm {

namespace {
std::size_t rounded(std::size_t n) { return (n + (std::size_t{2} << 20) - 1) / (std::size_t{2} << 20) * (std::size_t{2} << 20); }

// The driver may call upload/exchange from a helper thread (overlapped
// windows), whose current device is 0: bind it to the lane's device first.
void bind(int device) { cuda::check(::cudaSetDevice(device), "cudaSetDevice", {fmt::format("device {} for nccl_lane", device)}); }

// Memory the lane's recyclers make (memory/recycler.hpp): `make(capacity)`
// -> (owner, data); the owner is kept until the recycler frees the buffer,
// on the lane's device (a buffer may be freed on a sink's reaper thread).
template <class Make>
struct owned_memory {
  struct owners {
    std::mutex mu;
    std::unordered_map<void*, std::shared_ptr<void>> of;
  };
  int device = 0;
  Make make;
  std::shared_ptr<owners> kept = std::make_shared<owners>();

  std::size_t capacity_for(std::size_t n) const noexcept { return rounded(n); }
  void* allocate(std::size_t cap) {
    bind(device);  // cudaHostRegister/cudaMalloc run in the current device's context
    auto [owner, data] = make(cap);
    std::lock_guard g(kept->mu);
    kept->of.emplace(data, std::move(owner));
    return data;
  }
  void free(void* p, std::size_t) noexcept {
    std::shared_ptr<void> owner;
    {
      std::lock_guard g(kept->mu);
      auto it = kept->of.find(p);
      if (it == kept->of.end()) return;
      owner = std::move(it->second);
      kept->of.erase(it);
    }
    (void)::cudaSetDevice(device);
    owner.reset();  // cudaHostUnregister + munmap, or cudaFree
  }
};

void check_slot(unsigned slot) {
  if (slot >= 4) throw config_error(fmt::format("nccl_lane: slot {} (slots are 0..3)", slot));
}
}  // namespace

// The lane's pinned host buffers and device buffers, by the one reuse rule
// (memory/recycler.hpp): a buffer a sink still holds comes back when the
// sink lets go (its reaper thread, once the copy out of it completed),
// instead of going to cudaFree, which may synchronize the device and stall
// the exchange in flight. The recyclers keep what the lane's four slots
// have needed at most; release() frees the idle ones, and later returns are
// freed at once.
namespace {
auto make_pinned = [](std::size_t cap) {
  auto p = memory::pinned::allocate(cap, memory::pin_mode::host_register);
  return std::pair(p.keep(), p.data());
};
struct make_device {
  int device = 0;
  std::pair<std::shared_ptr<void>, std::byte*> operator()(std::size_t cap) const {
    auto b = std::make_shared<memory::device_buffer>(
        memory::device_buffer::allocate(cap, device, "nccl_lane window buffer"));
    std::byte* data = b->data();
    return {std::shared_ptr<void>(std::move(b)), data};
  }
};
}  // namespace

struct nccl_lane::buffers {
  explicit buffers(int device)
      : host(owned_memory<decltype(make_pinned)>{device, make_pinned}),
        dev(owned_memory<make_device>{device, make_device{device}}) {}
  memory::slot_recycler<owned_memory<decltype(make_pinned)>, 4> host;
  memory::slot_recycler<owned_memory<make_device>, 4> dev;
};

nccl_lane::nccl_lane(nccl& c) : c_(&c), buffers_(std::make_unique<buffers>(c.device())) {}
nccl_lane::nccl_lane(nccl&& c)
    : owned_(std::make_unique<nccl>(std::move(c))), c_(owned_.get()), buffers_(std::make_unique<buffers>(c_->device())) {}
nccl_lane::nccl_lane(nccl_lane&&) noexcept = default;
nccl_lane& nccl_lane::operator=(nccl_lane&&) noexcept = default;

nccl_lane::~nccl_lane() { release(); }

void nccl_lane::release() noexcept {
  if (!buffers_) return;  // moved from
  // No copy or NCCL kernel may still use the buffers when they go; the wait is
  // bounded (a stream stuck on a dead peer gets its communicator aborted).
  if (c_) (void)c_->drain(c_->stream());
  buffers_->host.all().release();
  buffers_->dev.all().release();
}

lease nccl_lane::host_buffer(unsigned slot, std::size_t n) {
  check_slot(slot);
  return buffers_->host.get(slot, n);
}

lease nccl_lane::device_buffer(unsigned slot, std::size_t n) {
  check_slot(slot);
  return buffers_->dev.get(slot, n);
}

nccl_lane_stats nccl_lane::stats() const noexcept {
  auto s = stats_;
  if (buffers_) {
    const auto h = buffers_->host.all().stats(), d = buffers_->dev.all().stats();
    s.host_allocations = h.allocations, s.device_allocations = d.allocations, s.device_recycled = d.reused;
  }
  return s;
}

lease nccl_lane::pin(std::span<std::byte> host, std::shared_ptr<void> keep) {
  if (host.empty()) return {};
  bind(c_->device());
  auto p = memory::pinned::register_existing(host, std::move(keep));
  // Unregistered once no upload enqueued from it can still be running: the
  // stream drains first (bounded, as in release()).
  std::shared_ptr<void> done(host.data(), [c = c_, reg = p.keep()](void*) mutable noexcept {
    (void)c->drain(c->stream());
    reg.reset();
  });
  return lease(std::move(done), host);
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
