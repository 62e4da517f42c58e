// cuda::device_sink: cudaMemcpyAsync from staging slots; views (and their
// slot leases) are released by a completion thread once the copy's event
// has completed.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <sluice/cuda/device.hpp>
#include <sluice/cuda/device_sink.hpp>
#include <sluice/cuda/host_register.hpp>
#include <sluice/cuda/device_buffer.hpp>

#include "../core/thread_name.hpp"

namespace sluice::inline v0::cuda {

struct device_sink::impl {
  struct pending_copy {
    cudaEvent_t done = nullptr;
    tensor_view view;  // holds the lease until `done` completed
  };

  explicit impl(device_sink_options o) : opt(o) {
    if (opt.streams == 0) opt.streams = 1;
    if (opt.alignment == 0 || (opt.alignment & (opt.alignment - 1)) != 0) opt.alignment = 256;
    bind();
    for (unsigned i = 0; i < opt.streams; ++i) streams.emplace_back();
    reaper = detail::named_thread("sluice-reaper", [this] { reap(); });
  }

  ~impl() {
    // Every event completes once its stream drains; the completion thread then
    // releases the remaining views before it stops. The streams, events and
    // registrations are the sink's device's, whatever thread destroys it.
    (void)::cudaSetDevice(opt.device);
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

  // The sink's device, current on the calling thread: CUDA's current device
  // is per thread, and a sink is fed from whatever thread runs the pipeline
  // (load() with threads > 1, a worker) — on another device its streams and
  // events are invalid handles, and a first call there makes a context on GPU 0.
  void bind() const {
    check(::cudaSetDevice(opt.device), "cudaSetDevice", {fmt::format("device {}", opt.device)});
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

  // A view whose home is host memory: to the host sink, or kept/declined here.
  bool accept_on_host(tensor_view v) {
    {
      std::lock_guard g(mu);
      stats.on_host += 1;
    }
    if (v.kind == view_kind::shared) {
      if (opt.map_shared) map_segment(v);
      if (opt.host_sink) return opt.host_sink(std::move(v));
      auto& kept = shared_views[v.name()];
      kept = std::move(v);  // holds the segment mapped while the sink lives
      return true;
    }
    if (opt.host_sink) return opt.host_sink(std::move(v));
    if (opt.host == host_views::decline) return false;
    const tensor_ref& t = *v.tensor;
    auto& h = host_copies[t.name];
    if (!h) h = lease::allocate(static_cast<std::size_t>(v.part_size()));
    if (v.offset + v.bytes.size() > h.bytes().size())
      throw config_error(fmt::format("piece [{}, {}) exceeds the tensor's {} bytes", v.offset, v.offset + v.bytes.size(),
                                     h.bytes().size()),
                         {"", t.name});
    if (!v.bytes.empty()) std::memcpy(h.bytes().data() + v.offset, v.bytes.data(), v.bytes.size());
    std::lock_guard g(mu);
    stats.host_bytes += v.bytes.size();
    return true;
  }

  // Registers the shared segment a view lies in (its hold is the whole
  // segment), once; the table's device address is then kept for get().
  void map_segment(const tensor_view& v) {
    const auto seg = v.hold.bytes();
    if (seg.empty() || v.bytes.data() < seg.data() || v.bytes.data() + v.bytes.size() > seg.data() + seg.size())
      throw config_error("device_sink: a shared view whose hold is not the segment it lies in", {"", v.name()});
    auto it = segments.find(seg.data());
    if (it == segments.end()) {
      bind();
      // The registration keeps a lease of the segment: it stays mapped until unregistered.
      auto keep = std::make_shared<lease>(v.hold);
      it = segments.emplace(seg.data(), host_registration::register_mapped(seg, keep, /*read_only=*/true)).first;
    }
    auto* dev = static_cast<std::byte*>(it->second.device_pointer()) + (v.bytes.data() - seg.data());
    mapped.insert_or_assign(v.name(), device_span{dev, v.bytes.size()});
  }

  bool accept(tensor_view v) {
    rethrow_failure();
    if (!v.carries_data()) return true;
    if (host_resident(v)) return accept_on_host(std::move(v));
    const tensor_ref& t = *v.tensor;
    bind();
    if (!device_sink::takes(v.part_size(), caller.count(t.name) || placed.count(t.name), opt.allocate)) return false;
    auto dst = destination(t, v.part_size());
    if (!dst.data && v.part_size()) return false;  // a caller destination without memory: declined
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
    // The event first: if taking one fails, nothing has been enqueued yet, so
    // the view (and its staging slot) may go at once. Enqueued first, a copy
    // could still read the slot after the pool had handed it out again.
    cudaEvent_t e = take_event(t.name);
    // A device-lane view (view_kind::device) is already in device memory.
    const auto dir = v.kind == view_kind::device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    if (const auto r = ::cudaMemcpyAsync(static_cast<std::byte*>(dst.data) + v.offset, v.bytes.data(), v.bytes.size(), dir, s);
        r != cudaSuccess) {
      give_back(e);
      check(r, "cudaMemcpyAsync", {"", t.name, byte_range{v.offset, v.offset + v.bytes.size()}});
    }
    if (const auto r = ::cudaEventRecord(e, s); r != cudaSuccess) {
      // The copy may be in flight with no event after it: drain the stream
      // before the view (and its slot) can go.
      (void)::cudaStreamSynchronize(s);
      give_back(e);
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

  void give_back(cudaEvent_t e) {
    std::lock_guard g(mu);
    free_events.push_back(e);
  }

  void finish() {
    {
      std::unique_lock lk(mu);
      idle.wait(lk, [this] { return queue.empty() && !in_reap; });
    }
    bind();
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
  std::map<std::string, lease> host_copies;          // per-rank host tables, kept in the sink's host memory
  std::map<std::string, tensor_view> shared_views;   // shared tables (the views hold the segment)
  std::map<const std::byte*, host_registration> segments;  // map_shared: by segment address
  std::map<std::string, device_span> mapped;         // map_shared: shared tables' device addresses
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

namespace {
// One arena for `sizes` (name, bytes), skipping names `skip` says are placed already.
template <class Skip>
device_sink::reservation lay_out(const std::vector<std::pair<std::string, std::size_t>>& sizes, std::size_t a, Skip skip) {
  device_sink::reservation r;
  for (const auto& [name, size] : sizes) {
    if (skip(name) || r.offsets.count(name)) continue;
    r.offsets.emplace(name, r.bytes);
    r.bytes += (size + a - 1) / a * a;
  }
  return r;
}

// What rank `rank` keeps on its device, at its part sizes, plan order.
std::vector<std::pair<std::string, std::size_t>> device_sizes(const policy::load_plan& plan, policy::rank_t rank) {
  std::vector<std::pair<std::string, std::size_t>> sizes;
  for (const auto& e : plan.entries)
    if (e.owners.contains(rank) && e.owner_destination == policy::destination::device)
      sizes.emplace_back(e.info.name, static_cast<std::size_t>(plan.kept_bytes(e)));
  return sizes;
}
}  // namespace

device_sink::reservation device_sink::plan_reservation(const policy::load_plan& plan, policy::rank_t rank,
                                                       std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) alignment = 256;
  return lay_out(device_sizes(plan, rank), alignment, [](const std::string&) { return false; });
}

namespace {
void make_arena(device_sink_options& opt, memory::device_buffer& arena, std::map<std::string, std::size_t>& arena_offsets,
                device_sink::reservation r, std::mutex& mu, device_sink_stats& stats) {
  if (r.bytes == 0) return;
  if (arena) throw config_error("device_sink::reserve: called twice");
  arena = memory::device_buffer::allocate(r.bytes, opt.device, fmt::format("arena for {} tensors", r.offsets.size()));
  {
    std::lock_guard g(mu);
    stats.allocated += r.bytes;
  }
  arena_offsets = std::move(r.offsets);
}
}  // namespace

void device_sink::reserve(const checkpoint& ck) {
  auto& m = *impl_;
  std::vector<std::pair<std::string, std::size_t>> sizes;
  for (const auto& t : ck.tensors()) sizes.emplace_back(t.name, static_cast<std::size_t>(t.size));
  auto r = lay_out(sizes, m.opt.alignment, [&m](const std::string& n) {
    return m.caller.count(n) || m.placed.count(n) || m.arena_offsets.count(n);
  });
  make_arena(m.opt, m.arena, m.arena_offsets, std::move(r), m.mu, m.stats);
}

void device_sink::reserve(const policy::load_plan& plan, policy::rank_t rank) {
  auto& m = *impl_;
  auto r = lay_out(device_sizes(plan, rank), m.opt.alignment, [&m](const std::string& n) {  // caller destinations take no arena space
    return m.caller.count(n) || m.placed.count(n) || m.arena_offsets.count(n);
  });
  make_arena(m.opt, m.arena, m.arena_offsets, std::move(r), m.mu, m.stats);
}

bool device_sink::accept(tensor_view v) { return impl_->accept(std::move(v)); }
void device_sink::finish() { impl_->finish(); }

device_span device_sink::get(const std::string& name) const {
  const auto& m = *impl_;
  if (auto it = m.caller.find(name); it != m.caller.end()) return it->second;
  if (auto it = m.placed.find(name); it != m.placed.end()) return it->second;
  if (auto it = m.mapped.find(name); it != m.mapped.end()) return it->second;
  if (const auto h = host(name); h.data()) return {nullptr, h.size()};  // on the host: no device address
  return {};
}

std::span<const std::byte> device_sink::host(const std::string& name) const {
  const auto& m = *impl_;
  if (auto it = m.host_copies.find(name); it != m.host_copies.end()) return it->second.bytes();
  if (auto it = m.shared_views.find(name); it != m.shared_views.end()) return it->second.bytes;
  return {};
}

void device_sink::download(const std::string& name, std::span<std::byte> out) const {
  if (const auto h = host(name); h.data()) {
    if (out.size() != h.size())
      throw config_error(fmt::format("device_sink::download: buffer holds {} bytes, the tensor {}", out.size(), h.size()),
                         {"", name});
    std::memcpy(out.data(), h.data(), h.size());
    return;
  }
  const auto d = get(name);
  if (!d.data && d.size == 0 && out.empty()) return;
  if (!d.data && d.size) throw config_error("device_sink::download: tensor not placed", {"", name});
  if (out.size() != d.size)
    throw config_error(fmt::format("device_sink::download: buffer holds {} bytes, the tensor {}", out.size(), d.size),
                       {"", name});
  if (d.size) {
    impl_->bind();
    check(::cudaMemcpy(out.data(), d.data, d.size, cudaMemcpyDefault), "cudaMemcpy", {"", name});
  }
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
