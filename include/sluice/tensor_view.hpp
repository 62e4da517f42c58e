#pragma once
/// \file
/// `tensor_view`: what the stage stage hands to sinks — a tensor (or an
/// ordered piece of one) with its bytes and the lease that keeps them alive.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <sluice/checkpoint.hpp>
#include <sluice/core/lease.hpp>

namespace sluice::inline v0 {

/// What a view carries.
enum class view_kind : std::uint8_t {
  bytes,     ///< `bytes` are the tensor's data, kept alive by `hold`
  placed,    ///< the data was read straight into the sink's destination (`bytes` is it)
  metadata,  ///< a probe: no data, `bytes` is empty (nothing was read); also the
             ///< distributed loader's placeholder for a tensor this rank does not own
  shared,    ///< the bytes live in the node's shared host segment (`bytes` maps it, valid
             ///< while `hold` lives): every local rank gets this view of one copy — a
             ///< placeholder, not a copy; sinks must not expect to own or free it
};

struct tensor_view {
  const tensor_ref* tensor = nullptr;   ///< name, dtype, shape, location (outlives the load)
  std::uint64_t offset = 0;             ///< of `bytes` within the tensor
  std::span<const std::byte> bytes;     ///< valid while `hold` (or the destination) lives
  lease hold;                           ///< the staging slot or owned buffer; release it when done
  view_kind kind = view_kind::bytes;

  [[nodiscard]] const std::string& name() const noexcept { return tensor->name; }
  [[nodiscard]] format::dtype dtype() const noexcept { return tensor->type; }
  [[nodiscard]] const std::vector<std::uint64_t>& shape() const noexcept { return tensor->shape; }
  /// Size of the whole tensor in bytes.
  [[nodiscard]] std::uint64_t tensor_size() const noexcept { return tensor->size; }
  /// The first piece of its tensor.
  [[nodiscard]] bool first() const noexcept { return offset == 0; }
  /// The last piece of its tensor (a whole tensor is first and last).
  [[nodiscard]] bool last() const noexcept {
    return kind == view_kind::metadata || offset + bytes.size() == tensor->size;
  }
  [[nodiscard]] bool whole() const noexcept { return first() && last(); }
};

}  // namespace sluice::inline v0
