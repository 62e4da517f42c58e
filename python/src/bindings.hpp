#pragma once
// What the binding units share: one unit per concern (as PyTorch's
// torch/csrc/Module.cpp is split), each with an init_x(module) that
// module.cpp's PYBIND11_MODULE calls, in this order:
//   errors.cpp      sluice.Error and its subclasses, from one table
//   dlpack.cpp      TensorItem: a tensor as it crosses, its DLPack capsule
//   checkpoint.cpp  Checkpoint, open_checkpoint (tensor list, inspect, select)
//   stream.cpp      StreamOptions, Stream (iter_weights), plan_owners, the memory cache
//   load_into.cpp   load_into, load_into_cuda
//   contract.cpp    Contract, RecorderCore, ReloadCore
// and the helpers one concern lends another: store.cpp (a torch.distributed
// store as comm::kv_store), stats.cpp (the library's stats as Python dicts).
// The units that see no pybind11 (distributed.cpp, cuda.cpp) share glue.hpp.
//
// Threads and the GIL: every load runs on a C++ thread of its own, with the
// GIL released by the Python thread that waits for it; that thread wakes up
// every 50 ms to run Python's signal handlers (Ctrl-C requests the load's
// stop token and the load ends with every slot returned). Python code called
// from a load thread (weight loaders of a reload session, the store) takes
// the GIL.

#include <utility>  // before Asio (Boost 1.74)

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <stop_token>
#include <map>
#include <string>
#include <unordered_set>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <pybind11/pybind11.h>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/store.hpp>
#include <sluice/load.hpp>
#include <sluice/tensor_stream.hpp>
#include <sluice/tensor_view.hpp>

#include "glue.hpp"  // opened_world (a collective open's world, kept for its load)

namespace sluice_py {

using namespace sluice;
namespace py = pybind11;

// ---- the types that cross concerns -------------------------------------------------

/// An opened checkpoint (sluice.Checkpoint; checkpoint.cpp).
struct py_checkpoint {
  std::shared_ptr<const checkpoint> ck;  // keeps the catalog it was opened through (an S3 one pins ETags)
  std::shared_ptr<opened_world> world;   // a collective open's world, until a distributed stream takes it
  bool s3 = false;
  bool is_s3() const { return s3; }
};

/// The options of a load from Python (sluice.StreamOptions; stream.cpp):
/// iter_weights', load_into's and a reload's, and the ranks of a collective open.
struct py_stream_options {
  std::size_t staging = std::size_t{4} << 30;
  std::uint64_t max_read = std::uint64_t{32} << 20;
  unsigned queue_depth = 4;
  unsigned threads = 1;
  std::string io = "auto";
  std::string exhausted = "copy";
  bool map_cached = true;  // tensors larger than a slot whose file is cached: page-cache views
  bool placeholders = true;  // hand out placeholders of other ranks' tensors (false: they stay in C++)
  std::unordered_set<std::string> stand_ins;  // with placeholders false: the names whose placeholders still come out
  // The engine's model's owners (plan_options::model_owners): name -> ranks; empty: the classifier's.
  std::map<std::string, std::vector<std::uint32_t>> model_owners;
  // Of those, the tensors the model splits: name -> (dimension 0 or 1, parts, each owner's part, runs
  // of the dimension each cut into parts: model_owner::groups, and their rows where unequal: run_rows).
  std::map<std::string, std::tuple<std::uint32_t, std::uint32_t, std::vector<std::uint32_t>, std::uint32_t,
                                   std::vector<std::uint64_t>>> model_parts;
  bool prefault = true;    // load_into: fault direct destinations in ahead (load_options::prefault_above)
  std::size_t queue = 8;
  // distributed (world_size > 1 or a topology)
  std::string topology, offload = "none";
  std::size_t rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  std::shared_ptr<comm::kv_store> kv;
  std::string kv_prefix;
  std::uint64_t timeout_ms = 60000;
  std::string host;   // the address this rank's Gloo device listens on (empty: SLUICE_GLOO_HOST, else 127.0.0.1)
  // PP > 1: layers per stage (empty: the plan's even split) and the patterns of
  // the layer-less tensors that go with the first / last stage (unset: the classifier's).
  std::vector<std::size_t> pp_stage_layers;
  std::optional<std::string> pp_first_pattern, pp_last_pattern;
  std::string expert_placement = "linear";  // or "round_robin" (policy::parse_expert_placement)
};

// ---- each concern's init, and what it lends the others ---------------------------------

/// errors.cpp: makes sluice's exception classes in `m` (sluice.Error and its
/// subclasses, from one table mirroring error.hpp) and registers the
/// translator of C++ errors into them.
void init_errors(py::module_& m);

/// dlpack.cpp: the class TensorItem.
void init_dlpack(py::module_& m);
/// A TensorItem for `v`: its name, a DLPack capsule over its bytes (None for
/// a view that carries none: a placeholder, metadata), its dtype, part shape,
/// kind, TP part and source name. The capsule's deleter drops `v`'s lease and
/// then `owner` (a stream's tensor: its slot pin and budget); deleters never
/// touch Python, so torch may run them on any thread. A device view is a
/// config_error (the package's host path never makes one).
py::object tensor_item(tensor_view v, stream_tensor owner);

/// checkpoint.cpp: the class Checkpoint and open_checkpoint.
void init_checkpoint(py::module_& m);
/// The URI of `t`'s shard ("" where `t` names none of `ck`'s shards).
std::string file_of(const checkpoint& ck, const tensor_ref& t);

/// stream.cpp: StreamOptions, Stream, plan_owners, parse_size, the memory cache.
void init_stream(py::module_& m);
/// The library's load options for `o` (io: "auto", "direct" or "buffered",
/// else config_error).
load_options make_load_options(const py_stream_options& o);
/// The ranks `o` describes (SLUICE_GLOO_HOST, where set, names this host).
comm::rank_info rank_info_of(const py_stream_options& o);

/// load_into.cpp: load_into, and load_into_cuda where the cuda component is built.
void init_load_into(py::module_& m);

/// contract.cpp: Contract, RecorderCore, ReloadCore.
void init_contract(py::module_& m);

/// store.cpp: a torch.distributed store (anything with set(key, bytes),
/// get(key) -> bytes, wait(keys, timedelta); delete_key(key) where it has
/// one) as the store a distributed load meets its peers through; None: null.
std::shared_ptr<comm::kv_store> torch_store(py::object store);

/// stats.cpp: JSON as Python objects, directly (no text in between):
/// objects are dicts (keys in nlohmann's sorted order), arrays lists,
/// numbers int or float; a non-finite float is None, as the JSON text once
/// made it; strings that are not UTF-8 keep their bytes backslash-escaped.
py::object to_py(const nlohmann::json& j);
/// The CPU seconds this process has used (user + system).
double cpu_seconds();
/// A local load's stats under the names sluice-load --json prints, with the
/// source, shards, staging budget, CPU time and peak RSS.
py::dict local_stats(const checkpoint& ck, const load_stats& st, const load_options& opt, double cpu);

/// `s` as a str, bytes that are not UTF-8 backslash-escaped: messages, names
/// and locations may carry bytes of a malformed file or a file's name.
inline py::str lenient_str(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// ---- running a blocking call interruptibly ----------------------------------------------

/// Runs f() on a thread of its own while this (Python) thread waits with the
/// GIL released, waking every 50 ms to run Python's signal handlers: a
/// KeyboardInterrupt requests `stop`, waits for f to end (it ends promptly
/// with cancelled_error, every slot returned) and is re-raised. `tick`, where
/// given, runs with the GIL held at each wake (a progress callback).
template <class F>
auto run_interruptible(std::stop_source& stop, F f, const std::function<void()>& tick = {}) -> decltype(f()) {
  using namespace std::chrono_literals;
  using R = decltype(f());
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr failure;
  std::optional<R> result;
  std::thread t([&] {
    try {
      result.emplace(f());
    } catch (...) {
      failure = std::current_exception();
    }
    std::lock_guard g(mu);
    done = true;
    cv.notify_all();
  });
  for (;;) {
    {
      py::gil_scoped_release nogil;
      std::unique_lock l(mu);
      if (cv.wait_for(l, 50ms, [&] { return done; })) break;
    }
    if (tick) tick();
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set interrupted;  // fetched now; restored when it propagates
      stop.request_stop();
      {
        py::gil_scoped_release nogil;
        t.join();
      }
      throw interrupted;
    }
  }
  {
    py::gil_scoped_release nogil;
    t.join();
  }
  if (failure) std::rethrow_exception(failure);
  return std::move(*result);
}

}  // namespace sluice_py
