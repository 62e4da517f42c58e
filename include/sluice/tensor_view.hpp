#pragma once
/// \file
/// `tensor_view`: what the `stage` pipeline stage (stages/stage.hpp) hands to sinks — a tensor (or an
/// ordered piece of one, or a rank's TP part of one) with its bytes and the
/// lease that keeps them alive.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <sluice/checkpoint.hpp>
#include <sluice/memory/lease.hpp>

namespace sluice::inline v0 {

/// What a view carries.
enum class view_kind : std::uint8_t {
  bytes,     ///< `bytes` are the tensor's data, kept alive by `hold`
  placed,    ///< the data was read straight into the sink's destination (`bytes` is it)
  metadata,  ///< a probe: no data, `bytes` is empty (nothing was read); the view
             ///< stands for a tensor a load *would* deliver, so a recorder records
             ///< what the loader would apply (probe.hpp)
  shared,    ///< the bytes live in the node's shared host segment (`bytes` maps it, valid
             ///< while `hold` lives; `hold.bytes()` is the whole segment): every local rank
             ///< gets this view of the node's one copy, not a copy of its own; sinks must
             ///< not expect to own or free it
  device,    ///< `bytes` are in DEVICE memory (a distributed load's device lane; never read
             ///< them on the host): copy them device-to-device (cuda::device_sink does) while
             ///< `hold` lives
  placeholder,  ///< a distributed load's stand-in for a tensor another rank owns: no
                ///< data, `bytes` is empty; nothing will be delivered here, so it is
                ///< never an application (a recorder neither offers nor records it)
};

/// The tensor-parallel part of a tensor a view carries: under TP > 1 a rank
/// keeps part `index` of `count` equal parts along dimension `dim` (0: a block
/// of rows; 1: a block of columns of every row, packed row-major). count 1:
/// the whole tensor. `groups` > 1: dimension `dim` is that many equal runs
/// (a fused tensor such as gate and up), and the part is block `index` of
/// every run, the runs' blocks packed in order (what a merged
/// column-parallel layer keeps); its shape is the same.
struct tensor_part {
  std::uint32_t dim = 0;
  std::uint32_t index = 0;
  std::uint32_t count = 1;
  std::uint32_t groups = 1;
  friend bool operator==(const tensor_part&, const tensor_part&) = default;
};

struct tensor_view {
  const tensor_ref* tensor = nullptr;   ///< name, dtype, shape, location (outlives the load)
  std::uint64_t offset = 0;             ///< of `bytes` within the tensor
  std::span<const std::byte> bytes;     ///< valid while `hold` (or the destination) lives
  lease hold;                           ///< the staging slot or owned buffer; release it when done
  view_kind kind = view_kind::bytes;
  tensor_part part;                     ///< the TP part `bytes` belong to (whole tensor by default)
  /// The load placed the tensor in host memory (a distributed load's offloaded
  /// table: per-rank host memory, or the shared segment): a sink that places
  /// tensors on the device leaves it on the host. False: the sink decides.
  bool host_destined = false;

  [[nodiscard]] const std::string& name() const noexcept { return tensor->name; }
  [[nodiscard]] format::dtype dtype() const noexcept { return tensor->type; }
  [[nodiscard]] const std::vector<std::uint64_t>& shape() const noexcept { return tensor->shape; }
  /// Size of the whole tensor in bytes.
  [[nodiscard]] std::uint64_t tensor_size() const noexcept { return tensor->size; }
  /// Whether the view carries one TP part rather than the whole tensor.
  [[nodiscard]] bool is_part() const noexcept { return part.count > 1; }
  /// Bytes of the part (the whole tensor's size when it is not split).
  [[nodiscard]] std::uint64_t part_size() const noexcept { return tensor->size / part.count; }
  /// Shape of the part: the tensor's, with dimension `part.dim` divided by the count.
  [[nodiscard]] std::vector<std::uint64_t> part_shape() const {
    auto s = tensor->shape;
    if (is_part() && part.dim < s.size()) s[part.dim] /= part.count;
    return s;
  }
  /// The first piece of its tensor (or part).
  [[nodiscard]] bool first() const noexcept { return offset == 0; }
  /// The last piece of its tensor or part (a whole one is first and last).
  [[nodiscard]] bool last() const noexcept {
    return !carries_data() || offset + bytes.size() == part_size();
  }
  /// False for the views that stand for a tensor without its bytes (a probe's
  /// metadata view, a distributed placeholder).
  [[nodiscard]] bool carries_data() const noexcept {
    return kind != view_kind::metadata && kind != view_kind::placeholder;
  }
  [[nodiscard]] bool whole() const noexcept { return first() && last(); }
};

/// Whether a view's home is host memory: a shared-segment view, or a table
/// the load keeps in host memory (`host_destined`). A sink that places tensors
/// on the device must leave such views on the host (never copy them up).
[[nodiscard]] inline bool host_resident(const tensor_view& v) noexcept {
  return v.kind == view_kind::shared || (v.host_destined && v.kind != view_kind::device);
}

}  // namespace sluice::inline v0
