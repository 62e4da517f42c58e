// load_into's CUDA destinations (built where the cuda component is): the
// bytes go from storage into pinned staging slots and from there to the
// tensors' device memory by cuda::device_sink's asynchronous copies. Kept out
// of module.cpp so that only this unit sees the CUDA runtime's headers.
#include "glue.hpp"

#include <sluice/cuda/device_sink.hpp>
#include <sluice/cuda/staging.hpp>
#include <sluice/load_file.hpp>

namespace sluice_py {

load_stats load_into_device(const checkpoint& ck, const std::vector<device_destination>& dst, int device, load_options opt) {
  // No allocation of its own: every selected tensor has its caller's destination.
  cuda::device_sink sink({.device = device, .allocate = false});
  for (const auto& d : dst)
    sink.set_destination(d.name, {reinterpret_cast<void*>(d.address), static_cast<std::size_t>(d.bytes)});
  auto pool = cuda::make_pinned_pool({.budget = opt.staging_budget, .slot_size = slot_size_for(opt.max_read)});
  return load(ck, sink, pool, std::move(opt));  // the loader calls sink.finish(): every copy has completed
}

}  // namespace sluice_py
