#pragma once
/// \file
/// `cuda::device_sink`: places tensors in device memory — at pointers the
/// caller gives (`set_destination`) or in allocations of its own (one arena
/// for the whole checkpoint after `reserve(ck)`, else one cudaMalloc per
/// tensor).
///
/// Each view is copied with cudaMemcpyAsync on one of a few non-blocking
/// streams (views of one staging slot share a stream; the next slot takes the
/// next stream, so the copies of consecutive slots overlap), then an event is
/// recorded after the copy. The sink keeps the view — and so its lease, and so
/// its staging slot — until that event has completed: a slot is never handed
/// back to the pool, let alone refilled, while a copy still reads it. A
/// completion thread waits for the events in order and releases the views;
/// `accept` never blocks on the GPU, so the sink cannot deadlock a pool whose
/// slots it holds. `finish()` (called by the loader after the last view) waits
/// for every copy and rethrows the first failure.
///
/// Views already in device memory (`view_kind::device`: a distributed load's
/// device lane, comm::nccl_lane) are copied device-to-device the same way,
/// and their lease (the lane's window buffer) is held until the copy is done.
///
/// Views whose home is host memory never reach device memory: shared-segment
/// views (`view_kind::shared`: the node's one copy of an offloaded table) and
/// tables a distributed load keeps in each rank's host memory
/// (`tensor_view::host_destined`). They go to `device_sink_options::host_sink`
/// when one is set; otherwise shared views are kept as they are (the sink
/// holds the view: the segment stays mapped; `map_shared` registers the
/// segment once, mapped, so that `get()` gives kernels a device address of
/// the table) and per-rank tables are copied into host memory the sink owns
/// (`host_views::keep`) or declined (`host_views::decline`).
///
/// Every entry point that touches CUDA (construction, accept, finish,
/// reserve, download, destruction, the completion thread) makes the sink's
/// device current on its thread first: a sink may be fed from any thread.
///
/// Staging memory should be pinned (cuda::make_pinned_pool): from pageable
/// memory cudaMemcpyAsync goes through a driver bounce buffer (correct, slow).
/// Every CUDA call is checked: failures are cuda::cuda_error naming the call
/// and the tensor.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include <sluice/checkpoint.hpp>
#include <sluice/cuda/device.hpp>
#include <sluice/cuda/error.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0::cuda {

/// What a device sink does with a per-rank host table (a view with
/// `tensor_view::host_destined`, not shared) when no host sink is given.
enum class host_views : std::uint8_t {
  keep,     ///< copy it into host memory the sink owns (`host()`, `download()` read it)
  decline,  ///< accept returns false
};

struct device_sink_options {
  int device = 0;               ///< CUDA device of every destination
  unsigned streams = 4;         ///< copy streams
  bool allocate = true;         ///< allocate tensors that have no caller destination (else: declined)
  std::size_t alignment = 256;  ///< of library allocations within the arena
  host_views host = host_views::keep;  ///< per-rank host tables, without `host_sink`
  /// Where host-destined and shared views go instead (its answer is accept's); empty: see `host`.
  std::function<bool(tensor_view)> host_sink;
  /// Register the node's shared segment with CUDA (once, mapped, read-only where the
  /// device supports it) when the first shared view arrives: `get()` then gives a
  /// shared table's device address (kernels read it in host memory, zero-copy).
  bool map_shared = false;
};

/// A destination in device memory.
struct device_span {
  void* data = nullptr;
  std::size_t size = 0;
};

/// What the sink did.
struct device_sink_stats {
  std::uint64_t copies = 0;        ///< cudaMemcpyAsync calls
  std::uint64_t bytes = 0;         ///< bytes copied to the device
  std::uint64_t max_pending = 0;   ///< most views (leases) held at once waiting for their copy
  std::uint64_t allocated = 0;     ///< bytes of device memory the sink allocated
  std::uint64_t on_host = 0;       ///< views left on the host (shared, per-rank tables; forwarded or not)
  std::uint64_t host_bytes = 0;    ///< bytes of per-rank tables the sink copied into its host memory
};

class device_sink {
 public:
  static constexpr bool device_views = true;  ///< takes a device lane's views (sink/concepts.hpp)
  /// Selects the device and creates the streams. Throws cuda_error (e.g.
  /// "cudaSetDevice failed: cudaErrorInsufficientDriver (35): ..." without a driver).
  explicit device_sink(device_sink_options opt = {});
  device_sink(device_sink&&) noexcept;
  device_sink& operator=(device_sink&&) noexcept;
  device_sink(const device_sink&) = delete;
  device_sink& operator=(const device_sink&) = delete;
  /// Waits for every copy (errors ignored), then frees what it allocated.
  ~device_sink();

  /// Places tensor `name` at `dst` (device memory of `dst.size` == the tensor's size bytes; under
  /// TP > 1 in a distributed load, the size of this rank's part: `tensor_view::part_size()`).
  void set_destination(const std::string& name, device_span dst);
  /// One device allocation for every tensor of `ck` without a caller destination
  /// (call before the load; optional: without it each tensor gets its own cudaMalloc).
  void reserve(const checkpoint& ck);
  /// The same for rank `rank` of a distributed load: only the tensors the plan
  /// places on its device (owned, `destination::device`), each at the size of the
  /// part the rank keeps (`plan.kept_bytes`); host and shared tables take none.
  void reserve(const policy::load_plan& plan, policy::rank_t rank);
  /// The arena reserve(plan, rank) makes: offsets by name, and the total (aligned to `alignment`).
  struct reservation {
    std::map<std::string, std::size_t> offsets;
    std::size_t bytes = 0;
  };
  [[nodiscard]] static reservation plan_reservation(const policy::load_plan& plan, policy::rank_t rank,
                                                    std::size_t alignment = 256);

  /// Enqueues the copy of `v`'s bytes; keeps `v` until the copy is done.
  /// Returns false (declined) for a tensor with no destination when
  /// allocation is off (`takes`). Rethrows a failure of an earlier copy.
  bool accept(tensor_view v);
  /// accept's decision for a view bound for device memory, without CUDA: a
  /// tensor of `part_size` bytes (its rank's part under TP) is taken when it
  /// has a destination (the caller's, or one the sink placed it at before) or
  /// the sink may allocate one (`allocate`); otherwise it is declined,
  /// whatever its size — a zero-size tensor too: having nothing to copy does
  /// not give it a place in device memory, and the loader must know that
  /// this sink did not take it.
  [[nodiscard]] static constexpr bool takes(std::uint64_t /*part_size*/, bool has_destination, bool allocate) noexcept {
    return has_destination || allocate;
  }
  /// Waits until every copy has completed and every view is released; rethrows the first failure.
  void finish();

  /// Where tensor `name` lives in device memory. data == nullptr: unknown (size 0),
  /// or kept in host memory (size is its size; `host()` gives the bytes). A shared
  /// table has a device address only with `map_shared`.
  [[nodiscard]] device_span get(const std::string& name) const;
  /// The host bytes of a tensor the sink kept on the host (shared or per-rank table); empty otherwise.
  [[nodiscard]] std::span<const std::byte> host(const std::string& name) const;
  /// Copies tensor `name` (from the device, or from its host copy) into `out`
  /// (synchronous). Throws config_error if unknown.
  void download(const std::string& name, std::span<std::byte> out) const;
  /// Views (leases) still held, waiting for their copy.
  [[nodiscard]] std::size_t pending() const;
  [[nodiscard]] device_sink_stats stats() const;
  [[nodiscard]] const device_sink_options& options() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

static_assert(sink<device_sink>);

}  // namespace sluice::inline v0::cuda
