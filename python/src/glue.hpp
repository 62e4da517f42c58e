#pragma once
// The Python package's C++ glue, shared by its two translation units:
// module.cpp (the bindings, the local loads) and distributed.cpp (the
// distributed driver over any_sink, which is the costly instantiation).
// Everything here calls sluice's public API only, so an API change upstream
// is adapted here.

#include <utility>  // before Asio (Boost 1.74)

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/store.hpp>
#include <sluice/core/staging_pool.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/error.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice_py {

using namespace sluice;

/// What the caller asked the staging pool to do when the tensors it holds
/// would leave the pipeline no slot to read into.
enum class on_exhausted : std::uint8_t { copy, raise };

/// The state a stream shares between the load thread (producer, the sink),
/// the Python iterator (consumer) and the DLPack deleters of the tensors
/// handed out (which may run on any thread, with or without the GIL: they
/// touch only this state, never Python).
struct stream_state {
  std::mutex mu;
  std::condition_variable changed;  // an item, space, the end, a stop
  std::deque<tensor_view> queue;
  std::deque<int> queue_slots;      // per queued view: the staging slot it pins (-1: none)
  std::size_t capacity = 8;         // views queued at most
  bool done = false;                // the load thread has finished (result or error)
  std::exception_ptr error;         // the load's error
  std::exception_ptr consumer_error;  // the consumer failed (a distributed rank's exception)
  std::stop_source stop;

  // Staging slots pinned by views handed to the consumer (queued or alive as
  // tensors): pins[slot] views. When pinning one more slot would leave the
  // pipeline fewer than `reserve` slots, the view is copied out (or raises).
  const staging_pool* pool = nullptr;
  std::vector<int> pins;
  std::size_t pinned_slots = 0;
  std::size_t pin_limit = 0;
  on_exhausted exhausted = on_exhausted::copy;
  std::uint64_t copied = 0, copied_bytes = 0;

  void unpin(int slot) {
    if (slot < 0) return;
    std::lock_guard g(mu);
    if (--pins[static_cast<std::size_t>(slot)] == 0) --pinned_slots;
    changed.notify_all();
  }
};

/// The load thread's sink: queues whole tensors for the Python iterator.
/// Blocks while the queue is full; throws cancelled_error when stopped, and
/// the consumer's error when it failed.
class queue_sink {
 public:
  static constexpr bool whole_tensors = true;
  explicit queue_sink(std::shared_ptr<stream_state> st) : st_(std::move(st)) {}
  bool accept(tensor_view v);
  /// A tensor larger than a read (it would take several slots and an
  /// assembly copy) is read straight into memory of its own, which the
  /// tensor handed to Python then owns.
  std::span<std::byte> direct_destination(const tensor_ref& t);

 private:
  std::shared_ptr<stream_state> st_;
  std::mutex mu_;
  struct placing {
    lease hold;
    std::uint64_t filled = 0;
  };
  std::map<const tensor_ref*, placing> direct_;
};

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
