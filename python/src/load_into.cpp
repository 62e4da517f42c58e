// load_into: the named tensors of a checkpoint read into the caller's
// preallocated memory (torch tensors' data_ptr), CPU through host_sink's
// placed reads, CUDA (load_into_cuda, where the cuda component is built)
// through cuda.cpp's pinned staging.
#include "bindings.hpp"
#include "glue.hpp"

#include <set>
#include <tuple>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <sluice/memory/prefaulter.hpp>
#include <sluice/load_file.hpp>
#include <sluice/sink/host_sink.hpp>

namespace sluice_py {

namespace {

// (name, address, bytes) of each destination.
using destinations = std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>;

// `ck`'s tensors that `dst` names (config_error naming a missing tensor), each
// checked to be as large as its destination.
checkpoint select_destinations(const checkpoint& ck, const destinations& dst) {
  std::set<std::string> names;
  for (const auto& [name, ptr, size] : dst) names.insert(name);
  checkpoint sub = ck.select(names);
  for (const auto& [name, ptr, size] : dst) {
    const auto* t = sub.find(name);
    if (t && t->size != size)
      throw config_error(fmt::format("the destination holds {} bytes, the tensor {}", size, t->size), {file_of(sub, *t), name});
  }
  return sub;
}

// `progress`, where not None, is called as progress(bytes_done, bytes_total)
// from this thread (the GIL held) every 50 ms while the load runs, and once at
// the end.
py::dict load_into(const py_checkpoint& p, const destinations& dst, const py_stream_options& o, const py::object& progress) {
  const checkpoint sub = select_destinations(*p.ck, dst);
  host_sink sink({.allocate = false});
  for (const auto& [name, ptr, size] : dst)
    sink.set_destination(name, {reinterpret_cast<std::byte*>(ptr), static_cast<std::size_t>(size)});
  auto lopt = make_load_options(o);
  std::stop_source stop;
  lopt.stop = stop.get_token();
  load_progress live;
  std::function<void()> tick;
  if (!progress.is_none()) {
    lopt.progress = &live;
    tick = [&] { progress(live.bytes_done.load(), sub.tensor_bytes()); };
  }
  const double cpu0 = cpu_seconds();
  auto st = run_interruptible(
      stop,
      [&] {
        staging_pool pool(staging_options{.budget = lopt.staging_budget, .slot_size = slot_size_for(lopt.max_read)});
        return load(sub, sink, pool, lopt);  // through the catalog the checkpoint came from
      },
      tick);
  if (tick) tick();
  return local_stats(sub, st, lopt, cpu_seconds() - cpu0);
}

#if SLUICE_PY_CUDA
// The same into CUDA tensors of one device: destinations are device addresses.
py::dict load_into_cuda(const py_checkpoint& p, const destinations& dst, int device, const py_stream_options& o) {
  const checkpoint sub = select_destinations(*p.ck, dst);
  std::vector<device_destination> where;
  for (const auto& [name, ptr, size] : dst) where.push_back({name, ptr, size});
  auto lopt = make_load_options(o);
  std::stop_source stop;
  lopt.stop = stop.get_token();
  const double cpu0 = cpu_seconds();
  auto st = run_interruptible(stop, [&] { return load_into_device(sub, where, device, lopt); });
  return local_stats(sub, st, lopt, cpu_seconds() - cpu0);
}
#endif

}  // namespace

void init_load_into(py::module_& m) {
  m.def("load_into", &load_into, py::arg("ck"), py::arg("dst"), py::arg("options"), py::arg("progress") = py::none());
  // sluice.prefault: a prefaulter over caller memory ((address, bytes) in the
  // order it will be filled), started before the load that fills it is
  // planned; stopping it joins its thread.
  py::class_<prefaulter, std::unique_ptr<prefaulter>>(m, "Prefaulter")
      .def(py::init([](const std::vector<std::pair<std::uintptr_t, std::uint64_t>>& dst, std::uint64_t min_bytes) {
             std::vector<std::span<std::byte>> spans;
             spans.reserve(dst.size());
             for (const auto& [ptr, size] : dst)
               spans.emplace_back(reinterpret_cast<std::byte*>(ptr), static_cast<std::size_t>(size));
             return std::make_unique<prefaulter>(std::move(spans), min_bytes);
           }),
           py::arg("dst"), py::arg("min_bytes"))
      .def("stop", &prefaulter::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("started", &prefaulter::started)
      .def_property_readonly("bytes", &prefaulter::bytes);
#if SLUICE_PY_CUDA
  m.def("load_into_cuda", &load_into_cuda);
#endif
}

}  // namespace sluice_py
