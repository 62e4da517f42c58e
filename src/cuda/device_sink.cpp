// cuda::device_sink: cudaMemcpyAsync from staging slots; views (and their
// slot leases) are released by a completion thread once the copy's event
// has completed.
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <sluice/cuda/device.hpp>
#include <sluice/cuda/device_sink.hpp>
#include <sluice/memory/device.hpp>

namespace sluice::inline v0::cuda {

struct device_sink::impl {
  struct pending_copy {
    cudaEvent_t done = nullptr;
    tensor_view view;  // holds the lease until `done` completed
  };

  explicit impl(device_sink_options o) : opt(o) {
    if (opt.streams == 0) opt.streams = 1;
    if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) != 0) opt.alignment = 256;
    check(::cudaSetDevice(opt.device), "cudaSetDevice", {fmt::format("device {}", opt.device)});
    for (unsigned i = 0; i < opt.streams; ++i) streams.emplace_back();
    reaper = std::thread([this] { reap(); });
  }

  ~impl() {
    // Every event completes once its stream drains; the completion thread then
    // releases the remaining views before it stops.
    for (auto& s : streams) (void)::cudaStreamSynchronize(s.get());
    {
      std::lock_guard g(mu);
      stopping = true;
    }
    cv.notify_all();
    if (reaper.joinable()) reaper.join();
    for (auto& p : queue) (void)::cudaEventDestroy(p.done);  // only if the thread stopped early
    for (auto* e : free_events) (void)::cudaEventDestroy(e);
  }

  // The completion thread: waits for the oldest copy, then releases its view.
  void reap() {
    (void)::cudaSetDevice(opt.device);
    std::unique_lock lk(mu);
    for (;;) {
      cv.wait(lk, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping, nothing left
      auto item = std::move(queue.front());
      queue.pop_front();
      in_reap = true;
      lk.unlock();
      const auto r = ::cudaEventSynchronize(item.done);
      std::exception_ptr failure_here;
      if (r != cudaSuccess) {
        try {
          check(r, "cudaEventSynchronize", {"", item.view.tensor ? item.view.tensor->name : std::string()});
        } catch (...) {
          failure_here = std::current_exception();
        }
      }
      // The copy has completed (or the context is dead: no copy reads the slot any more).
      item.view = {};
      lk.lock();
      in_reap = false;
      free_events.push_back(item.done);
      if (failure_here && !failure) failure = failure_here;
      idle.notify_all();
    }
  }

  cudaEvent_t take_event(const std::string& tensor) {
    {
      std::lock_guard g(mu);
      if (!free_events.empty()) {
        auto* e = free_events.back();
        free_events.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check(::cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreateWithFlags",
          {"", tensor});
    return e;
  }

  void rethrow_failure() {
    std::lock_guard g(mu);
    if (failure) std::rethrow_exception(std::exchange(failure, nullptr));
  }

  // `size`: the tensor's, or its TP part's (a distributed rank keeps a part).
  device_span destination(const tensor_ref& t, std::uint64_t size) {
    if (auto it = caller.find(t.name); it != caller.end()) {
      if (it->second.size != size)
        throw config_error(fmt::format("device destination holds {} bytes, the tensor{} {}", it->second.size,
                                       size == t.size ? "" : "'s part", size),
                           {"", t.name});
      return it->second;
    }
    if (auto it = placed.find(t.name); it != placed.end()) return it->second;
    if (!opt.allocate) return {};
    if (auto it = arena_offsets.find(t.name); it != arena_offsets.end()) {
      device_span d{arena.data() + it->second, static_cast<std::size_t>(size)};
      placed.emplace(t.name, d);
      return d;
    }
    auto b = memory::device_buffer::allocate(static_cast<std::size_t>(size), opt.device, t.name);
    device_span d{b.data(), b.size()};
    {
      std::lock_guard g(mu);
      stats.allocated += b.size();
    }
    owned.push_back(std::move(b));
    placed.emplace(t.name, d);
    return d;
  }

  bool accept(tensor_view v) {
    rethrow_failure();
    if (v.kind == view_kind::metadata) return true;
    const tensor_ref& t = *v.tensor;
    auto dst = destination(t, v.part_size());
    if (!dst.data && v.part_size()) return false;  // neither given nor allocated: declined
    if (v.kind == view_kind::placed || v.bytes.empty()) return true;
    if (v.offset + v.bytes.size() > dst.size)
      throw config_error(fmt::format("piece [{}, {}) exceeds the {}-byte device destination", v.offset,
                                     v.offset + v.bytes.size(), dst.size),
                         {"", t.name});
    // Views of one slot share a stream; a new slot moves to the next stream.
    const void* slot = v.hold ? static_cast<const void*>(v.hold.bytes().data()) : nullptr;
    if (slot != last_slot || !slot) {
      last_slot = slot;
      next_stream = (next_stream + 1) % streams.size();
    }
    cudaStream_t s = streams[next_stream].get();
    // A device-lane view (view_kind::device) is already in device memory.
    const auto dir = v.kind == view_kind::device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    check(::cudaMemcpyAsync(static_cast<std::byte*>(dst.data) + v.offset, v.bytes.data(), v.bytes.size(), dir, s),
          "cudaMemcpyAsync", {"", t.name, byte_range{v.offset, v.offset + v.bytes.size()}});
    cudaEvent_t e = take_event(t.name);
    if (const auto r = ::cudaEventRecord(e, s); r != cudaSuccess) {
      // The copy may be in flight with no event after it: drain the stream
      // before the view (and its slot) can go.
      (void)::cudaStreamSynchronize(s);
      std::lock_guard g(mu);
      free_events.push_back(e);
      check(r, "cudaEventRecord", {"", t.name});
    }
    {
      std::lock_guard g(mu);
      stats.copies += 1;
      stats.bytes += v.bytes.size();
      queue.push_back({e, std::move(v)});
      stats.max_pending = std::max<std::uint64_t>(stats.max_pending, queue.size() + (in_reap ? 1 : 0));
    }
    cv.notify_one();
    return true;
  }

  void finish() {
    {
      std::unique_lock lk(mu);
      idle.wait(lk, [this] { return queue.empty() && !in_reap; });
    }
    for (auto& s : streams) s.synchronize();
    rethrow_failure();
  }

  device_sink_options opt;
  std::vector<stream> streams;
  std::size_t next_stream = 0;
  const void* last_slot = nullptr;
  std::map<std::string, device_span> caller;
  std::map<std::string, device_span> placed;
  std::map<std::string, std::size_t> arena_offsets;
  memory::device_buffer arena;
  std::vector<memory::device_buffer> owned;
  device_sink_stats stats;

  mutable std::mutex mu;
  std::condition_variable cv;    // queue non-empty / stopping
  std::condition_variable idle;  // a copy was retired
  std::deque<pending_copy> queue;
  std::vector<cudaEvent_t> free_events;
  bool in_reap = false;
  bool stopping = false;
  std::exception_ptr failure;
  std::thread reaper;  // last: started after, joined before, everything above
};

device_sink::device_sink(device_sink_options opt) : impl_(std::make_unique<impl>(opt)) {}
device_sink::device_sink(device_sink&&) noexcept = default;
device_sink& device_sink::operator=(device_sink&&) noexcept = default;
device_sink::~device_sink() = default;

void device_sink::set_destination(const std::string& name, device_span dst) { impl_->caller[name] = dst; }

void device_sink::reserve(const checkpoint& ck) {
  auto& m = *impl_;
  const std::size_t a = m.opt.alignment;
  std::size_t total = 0;
  std::map<std::string, std::size_t> offsets;
  for (const auto& t : ck.tensors()) {
    if (m.caller.count(t.name) || m.placed.count(t.name) || m.arena_offsets.count(t.name)) continue;
    offsets.emplace(t.name, total);
    total += (static_cast<std::size_t>(t.size) + a - 1) / a * a;
  }
  if (total == 0) return;
  if (m.arena) throw config_error("device_sink::reserve: called twice");
  m.arena = memory::device_buffer::allocate(total, m.opt.device,
                                            fmt::format("arena for {} tensors", offsets.size()));
  {
    std::lock_guard g(m.mu);
    m.stats.allocated += total;
  }
  m.arena_offsets = std::move(offsets);
}

bool device_sink::accept(tensor_view v) { return impl_->accept(std::move(v)); }
void device_sink::finish() { impl_->finish(); }

device_span device_sink::get(const std::string& name) const {
  if (auto it = impl_->caller.find(name); it != impl_->caller.end()) return it->second;
  if (auto it = impl_->placed.find(name); it != impl_->placed.end()) return it->second;
  return {};
}

void device_sink::download(const std::string& name, std::span<std::byte> out) const {
  const auto d = get(name);
  if (!d.data && d.size == 0 && out.empty()) return;
  if (!d.data && d.size) throw config_error("device_sink::download: tensor not placed", {"", name});
  if (out.size() != d.size)
    throw config_error(fmt::format("device_sink::download: buffer holds {} bytes, the tensor {}", out.size(), d.size),
                       {"", name});
  if (d.size) check(::cudaMemcpy(out.data(), d.data, d.size, cudaMemcpyDeviceToHost), "cudaMemcpy", {"", name});
}

std::size_t device_sink::pending() const {
  std::lock_guard g(impl_->mu);
  return impl_->queue.size() + (impl_->in_reap ? 1 : 0);
}

device_sink_stats device_sink::stats() const {
  std::lock_guard g(impl_->mu);
  return impl_->stats;
}

const device_sink_options& device_sink::options() const noexcept { return impl_->opt; }

}  // namespace sluice::inline v0::cuda
