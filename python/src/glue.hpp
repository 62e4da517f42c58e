#pragma once
// The Python package's C++ glue that needs no Python: the calls the binding
// units (bindings.hpp) make into the units that see no pybind11, so that the
// costly instantiations compile apart and in parallel: distributed.cpp (the
// distributed driver over any_sink, the collective open) and cuda.cpp (CUDA
// destinations, where the cuda component is built). Everything here calls
// sluice's public API only, so an API change upstream is adapted here.

#include <utility>  // before Asio (Boost 1.74)

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/store.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/any_sink.hpp>

// Declared only: distributed/options.hpp (the plan, the windows, all of
// nlohmann::json) is for the units that make or take them, not for every
// unit that includes this.
namespace sluice::inline v0 {
struct distributed_options;
}

namespace sluice_py {

using namespace sluice;

/// Distributed settings of a stream (world.hpp's tool-level call).
struct distributed_request {
  std::string topology, offload;
  comm::rank_info who;
};

/// Runs the distributed load of `ck` into `s` (distributed.cpp).
nlohmann::json run_distributed(const checkpoint& ck, const distributed_request& req, any_sink s, distributed_options opt);

/// Opens the checkpoint at `where` once for the world `who` describes
/// (distributed.cpp): joins it, rank 0 reads the index and headers and the
/// others replay them (checkpoint::open(location, communicator)), then the
/// ranks exchange their outcomes, so that a rank that failed where rank 0
/// did not (its own copy of a directory) fails every rank at once. A rank
/// that failed itself throws its own (typed) error; the others throw
/// distributed_error naming it. The world is left before returning.
checkpoint open_collective(const location& where, const open_options& opt, const comm::rank_info& who);

/// A tensor's destination in device memory (a CUDA torch tensor's data_ptr).
struct device_destination {
  std::string name;
  std::uintptr_t address = 0;
  std::uint64_t bytes = 0;
};

/// Loads `dst`'s tensors of `ck` into device `device`'s memory at the given
/// addresses: pinned staging, cuda::device_sink's asynchronous copies, every
/// copy complete on return (cuda.cpp; only where the cuda component is built,
/// SLUICE_PY_CUDA).
load_stats load_into_device(const checkpoint& ck, const std::vector<device_destination>& dst, int device, load_options opt);

}  // namespace sluice_py
