#pragma once
/// \file
/// A staging pool over pinned memory: the fetch stage reads (io_uring,
/// O_DIRECT) into slots that the device sink copies to the GPU with
/// cudaMemcpyAsync at full speed.
///
///   auto pool = cuda::make_pinned_pool({.budget = 1ull << 30, .slot_size = slot_size_for(32 << 20)});
///   load(ck, device_sink, pool, opts);

#include <sluice/memory/staging_pool.hpp>
#include <sluice/cuda/pinned.hpp>

namespace sluice::inline v0::cuda {

/// A pool of `opt.budget` bytes (rounded down to whole slots) of pinned
/// memory. `mode` defaults to an anonymous mapping registered with CUDA
/// (O_DIRECT and io_uring fixed buffers work on it as on any mapping).
/// Throws config_error (budget below one slot) or cuda_error.
[[nodiscard]] inline staging_pool make_pinned_pool(staging_options opt,
                                                   memory::pin_mode mode = memory::pin_mode::host_register) {
  const std::size_t slot = (std::max<std::size_t>(opt.slot_size, 4096) + 4095) / 4096 * 4096;
  const std::size_t count = opt.budget / slot;
  if (count == 0)
    throw config_error(fmt::format("staging budget of {} bytes cannot hold one {}-byte slot", opt.budget, slot));
  auto mem = memory::pinned::allocate(count * slot, mode);
  opt.memory = {mem.bytes(), mem.keep()};
  return staging_pool(std::move(opt));
}

}  // namespace sluice::inline v0::cuda
