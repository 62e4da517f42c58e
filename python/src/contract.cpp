// The load contract from Python (manifest/contract.hpp, manifest/reload.hpp,
// probe.hpp): Contract, RecorderCore (the recording loader wrapper, probe)
// and ReloadCore (a layerwise reload session). The package's _contract.py
// adapts engine weight loaders to them.
#include "bindings.hpp"

#include <set>

#include <pybind11/stl.h>

#include <sluice/load_file.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/manifest/reload.hpp>
#include <sluice/probe.hpp>

namespace sluice_py {

namespace {

// A Python weight loader as a C++ one. `adapter(name, item_or_tensor)` (the
// package's Python side) calls the engine's loader and returns
// (accepted, [(destination, {selector: value})]). Called with the GIL taken,
// from whichever thread the load calls its sink on.
struct py_loader {
  py::object adapter;
  std::shared_ptr<py::object> current;  // a tensor the caller already has (Recorder.__call__), else None

  bool operator()(tensor_view v, manifest::application_log& log) {
    py::gil_scoped_acquire gil;
    py::object arg;
    if (current && !current->is_none()) arg = *current;
    else arg = tensor_item(std::move(v), {});
    py::tuple r = adapter(py::str(std::string(log.source())), arg);
    const bool accepted = r[0].cast<bool>();
    for (auto rec : r[1].cast<py::list>()) {
      auto t = rec.cast<py::tuple>();
      manifest::selectors sel;
      for (auto [k, val] : t[1].cast<py::dict>()) {
        if (py::isinstance<py::bool_>(val) || !(py::isinstance<py::int_>(val) || py::isinstance<py::str>(val)))
          throw config_error(fmt::format("selector '{}' of '{}' must be an int or a str", py::str(k).cast<std::string>(),
                                         std::string(log.source())));
        if (py::isinstance<py::int_>(val)) sel.emplace(k.cast<std::string>(), val.cast<std::int64_t>());
        else sel.emplace(k.cast<std::string>(), val.cast<std::string>());
      }
      log.record(t[0].cast<std::string>(), std::move(sel));
    }
    return accepted;
  }
};

py::list keys_list(const std::set<manifest::application_key>& keys) {
  py::list out;
  for (const auto& k : keys) {
    py::dict sel;
    for (const auto& [name, v] : k.select) {
      if (const auto* i = std::get_if<std::int64_t>(&v)) sel[py::str(name)] = *i;
      else sel[py::str(name)] = std::get<std::string>(v);
    }
    out.append(py::make_tuple(k.source, k.destination, sel));
  }
  return out;
}

struct py_publish {
  py::object fn;
  void operator()(const manifest::layer_contract& lc) {
    py::gil_scoped_acquire gil;
    if (fn.is_none()) return;
    fn(lc.layer == manifest::non_layer ? py::object(py::none()) : py::object(py::int_(lc.layer)), keys_list(lc.keys));
  }
};

using recorder_t = manifest::recorder<py_loader>;
using session_t = manifest::reload_session<py_loader, py_publish>;

struct py_recorder {
  std::shared_ptr<py::object> current = std::make_shared<py::object>(py::none());
  recorder_t rec;
  py_recorder(py::object adapter, std::string pattern)
      : rec(py_loader{std::move(adapter), nullptr}, manifest::recorder_options{std::move(pattern)}) {
    rec.loader().current = current;
  }
  // Offers a tensor the caller already has (name, sluice dtype, shape, bytes, the tensor).
  bool offer(const std::string& name, const std::string& dtype, std::vector<std::uint64_t> shape, std::uint64_t size,
             py::object tensor) {
    tensor_ref ref;
    ref.name = ref.source_name = name;
    const auto t = format::parse_dtype(dtype);
    if (!t) throw config_error(fmt::format("unknown dtype '{}'", dtype), {"", name});
    ref.type = *t;
    ref.shape = std::move(shape);
    ref.size = size;
    tensor_view v;
    v.tensor = &ref;
    v.kind = view_kind::metadata;
    *current = std::move(tensor);
    struct reset {
      std::shared_ptr<py::object> c;
      ~reset() { *c = py::none(); }
    } r{current};
    return rec.accept(std::move(v));
  }
};

struct py_session {
  std::unique_ptr<session_t> s;
  py_session(const manifest::contract& c, py::object adapter, py::object on_publish, bool require_all, py::object warn) {
    manifest::reload_options ro;
    ro.require_all_layers = require_all;
    if (!warn.is_none())
      ro.warn = [warn](const std::string& w) {
        py::gil_scoped_acquire gil;
        warn(w);
      };
    s = std::make_unique<session_t>(c, py_loader{std::move(adapter), nullptr}, py_publish{std::move(on_publish)}, std::move(ro));
  }
};

}  // namespace

void init_contract(py::module_& m) {
  py::class_<manifest::contract>(m, "Contract")
      .def(py::init<std::string>(), py::arg("layer_pattern") = std::string(manifest::default_layer_pattern))
      .def_static("from_json", [](const std::string& s) {
        try {
          return manifest::contract::from_json(nlohmann::json::parse(s));
        } catch (const nlohmann::json::exception& e) {
          throw contract_error(fmt::format("contract JSON: {}", e.what()));
        }
      })
      // JSON text on purpose: it is the contract's file format (save, diff, ship).
      .def("to_json", [](const manifest::contract& c, int indent) { return c.to_json().dump(indent); }, py::arg("indent") = -1)
      .def_property_readonly("layer_pattern", &manifest::contract::layer_pattern)
      .def_property_readonly("bytes", &manifest::contract::bytes)
      .def("__len__", &manifest::contract::size)
      .def("layers", [](const manifest::contract& c) {
        py::dict d;
        for (const auto& [l, lc] : c.layers())
          d[l == manifest::non_layer ? py::object(py::none()) : py::object(py::int_(l))] = keys_list(lc.keys);
        return d;
      })
      .def("__eq__", [](const manifest::contract& a, const manifest::contract& b) { return a == b; });

  py::class_<py_recorder>(m, "RecorderCore")
      .def(py::init<py::object, std::string>())
      .def("offer", &py_recorder::offer)
      .def("freeze", [](const py_recorder& r) { return r.rec.freeze(); })
      .def("applications", [](const py_recorder& r) {
        std::set<manifest::application_key> ks(r.rec.applications().begin(), r.rec.applications().end());
        return keys_list(ks);
      })
      .def("probe", [](py_recorder& r, const py_checkpoint& p) {
        const auto res = probe(*p.ck, r.rec);
        py::dict d;
        d["tensors"] = res.seen.size();
        d["accepted"] = res.accepted_count();
        d["tensor_bytes"] = res.tensor_bytes;
        d["header_bytes_read"] = res.header_bytes_read;
        d["bytes_read"] = res.bytes_read;
        return d;
      });

  py::class_<py_session>(m, "ReloadCore")
      .def(py::init<const manifest::contract&, py::object, py::object, bool, py::object>())
      .def("reload", [](py_session& s, const py_checkpoint& p, const py_stream_options& o) {
        auto lopt = make_load_options(o);
        std::stop_source stop;
        lopt.stop = stop.get_token();
        const double cpu0 = cpu_seconds();
        auto st = run_interruptible(stop, [&] {
          s.s->check_update(*p.ck);
          return load(*p.ck, *s.s, lopt);  // ends the update with finish()
        });
        return local_stats(*p.ck, st, lopt, cpu_seconds() - cpu0);
      })
      .def("push", [](py_session& s, const std::string& name, const std::string& dtype, std::vector<std::uint64_t> shape,
                      std::uintptr_t ptr, std::uint64_t size) {
        const auto t = format::parse_dtype(dtype);
        if (!t) throw config_error(fmt::format("unknown dtype '{}'", dtype), {"", name});
        return s.s->push(name, *t, std::move(shape), {reinterpret_cast<const std::byte*>(ptr), static_cast<std::size_t>(size)});
      })
      .def("finish", [](py_session& s) { return s.s->finish(); })
      .def("stats", [](py_session& s) {
        const auto& st = s.s->stats();
        py::dict d;
        d["updates"] = st.updates;
        d["tensors"] = st.tensors;
        d["layers_published"] = st.layers_published;
        d["extras"] = st.extras;
        d["declined"] = st.declined;
        d["buffered_bytes"] = st.buffered_bytes;
        d["peak_buffered_bytes"] = st.peak_buffered_bytes;
        return d;
      });
}

}  // namespace sluice_py
