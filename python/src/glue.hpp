#pragma once
// The Python package's C++ glue that needs no Python: the calls the binding
// units (bindings.hpp) make into the units that see no pybind11, so that the
// costly instantiations compile apart and in parallel: distributed.cpp (the
// distributed driver over any_sink, the collective open) and cuda.cpp (CUDA
// destinations, where the cuda component is built). Everything here calls
// sluice's public API only, so an API change upstream is adapted here.

#include <utility>  // before Asio (Boost 1.74)

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/any_communicator.hpp>
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

/// The world a collective open joined, kept for the load that follows, so
/// that one load is one Gloo world (one rendezvous, one mesh of pairs): the
/// first distributed stream over the checkpoint with the same ranks takes
/// it; any later one joins its own.
struct opened_world {
  std::mutex mu;
  std::unique_ptr<comm::any_communicator> c;
  comm::rank_info who;
  /// `c` if it is still here and was joined for `w`'s rank and world size.
  std::unique_ptr<comm::any_communicator> take(const comm::rank_info& w) {
    std::lock_guard g(mu);
    if (!c || who.rank != w.rank || who.world_size != w.world_size) return nullptr;
    return std::move(c);
  }
};

/// Runs the distributed load of `ck` into `s` (distributed.cpp), over
/// `world` when given (the collective open's), else a world it joins.
nlohmann::json run_distributed(const checkpoint& ck, const distributed_request& req, any_sink s, distributed_options opt,
                               std::unique_ptr<comm::any_communicator> world = nullptr);

/// Opens the checkpoint at `where` once for the world `who` describes
/// (distributed.cpp): joins it, rank 0 reads the index and headers and the
/// others replay them (checkpoint::open(location, communicator)), then the
/// ranks exchange their outcomes, so that a rank that failed where rank 0
/// did not (its own copy of a directory) fails every rank at once. A rank
/// that failed itself throws its own (typed) error; the others throw
/// distributed_error naming it. The world is handed to `keep` (for the load
/// that follows), or left before returning when `keep` is null.
checkpoint open_collective(const location& where, const open_options& opt, const comm::rank_info& who,
                           opened_world* keep = nullptr);

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
