// Opened checkpoints in Python: open_checkpoint (selection by regex or
// callable, renaming, a local index, a collective open) and the class
// Checkpoint (its tensors, inspect, select).
#if SLUICE_PY_HAS_S3
#include <sluice/cache/block_cache.hpp>
#include <sluice/s3/source.hpp>
#endif
#include "bindings.hpp"
#include "glue.hpp"

#include <array>
#include <map>
#include <optional>
#include <set>

#include <pybind11/stl.h>

#include <sluice/format/name_pattern.hpp>
#include <sluice/policy/classify.hpp>

namespace sluice_py {

namespace {

// `who`: None, or the StreamOptions of a distributed load (rank, world, local
// ranks, store, timeout) whose ranks open the checkpoint together: rank 0
// reads the metadata and the others replay it (open_collective).
location location_of(const std::string& where, const std::string& cache, std::uint64_t cache_max) {
  if (cache.empty() && !cache_max) return location(where);
  if (!where.starts_with("s3://"))
    throw config_error(fmt::format("cache: only s3:// checkpoints are cached ('{}' is read where it is)", where));
#if SLUICE_PY_HAS_S3
  auto cfg = s3::config::from_environment();
  if (!cache.empty()) cfg.cache.dir = cache;
  if (cache_max) cfg.cache.max_bytes = cache_max;
  if (cfg.cache.dir.empty()) throw config_error("cache_max needs a cache directory (cache= or SLUICE_CACHE_DIR)");
  return s3_location(where, std::move(cfg));
#else
  throw missing_component_error("s3", "cache: this sluice was built without the s3 component");
#endif
}

// The process's node-local cache counters (the cache it used last), or None.
py::object cache_stats() {
#if SLUICE_PY_HAS_S3
  const auto c = cache::block_cache::last_used();
  if (!c) return py::none();
  const auto& s = *c->stats;
  py::dict d;
  d["dir"] = c->dir;
  d["hit_bytes"] = s.hit_bytes.load();
  d["fetched_bytes"] = s.fetched_bytes.load();
  d["refetched_bytes"] = s.refetched_bytes.load();
  d["bad_blocks"] = s.bad_blocks.load();
  d["written_blocks"] = s.written_blocks.load();
  d["unwritten_blocks"] = s.unwritten_blocks.load();
  d["evicted_blocks"] = s.evicted_blocks.load();
  d["hashed_bytes"] = s.hashed_bytes.load();
  d["hash_seconds"] = static_cast<double>(s.hash_ns.load()) / 1e9;
  return d;
#else
  return py::none();
#endif
}

py_checkpoint open_checkpoint(const std::string& where, py::object select_regex, py::object select_fn,
                              const std::vector<std::pair<std::string, std::string>>& rename, const std::string& index,
                              const py_stream_options* who, const std::map<std::string, std::uint64_t>& limits,
                              const std::string& cache, std::uint64_t cache_max) {
  open_options opt;
  if (!index.empty()) opt.index = index;
  // limits={"max_tensors": N, ...}: format::limits by its fields' names.
  for (const auto& [k, v] : limits) {
    auto& l = opt.limits;
    if (k == "max_header_bytes") l.max_header_bytes = v;
    else if (k == "max_index_bytes") l.max_index_bytes = v;
    else if (k == "max_tensors") l.max_tensors = v;
    else if (k == "max_depth") l.max_depth = static_cast<std::uint32_t>(std::min<std::uint64_t>(v, UINT32_MAX));
    else if (k == "max_name_bytes") l.max_name_bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(v, UINT32_MAX));
    else
      throw config_error(fmt::format("limits: unknown key '{}' (max_header_bytes, max_index_bytes, max_tensors, max_depth, "
                                     "max_name_bytes)", printable(k, 64)));
  }
  for (const auto& [from, to] : rename) opt.rename.push_back({from, to});
  if (!select_regex.is_none()) {
    // RE2 syntax, compiled in the core (format/name_pattern.hpp): linear in the name.
    const auto pattern = select_regex.cast<std::string>();
    try {
      opt.select = format::matching(pattern);
    } catch (const config_error& e) {
      throw config_error(fmt::format("select: {}", e.detail()));
    }
  } else if (!select_fn.is_none()) {
    // Called on this thread. A collective open runs without the GIL (it waits
    // on its peers), so the call takes it, and copies of the function share
    // one reference that is dropped under the GIL.
    std::shared_ptr<py::object> fn(new py::object(std::move(select_fn)), [](py::object* f) {
      py::gil_scoped_acquire gil;
      delete f;
    });
    opt.select = [fn](std::string_view n) {
      py::gil_scoped_acquire gil;
      return py::cast<bool>((*fn)(py::str(n.data(), n.size())));
    };
  }
  // A path, or an s3:// URI (its catalog reads the environment's S3 config,
  // and reads through the node-local cache `cache` when given).
  const location at = location_of(where, cache, cache_max);
  py_checkpoint r;
  r.s3 = !at.local();
  if (const auto ranks = who ? rank_info_of(*who) : comm::rank_info{}; ranks.world_size > 1) {
    py::gil_scoped_release nogil;
    r.world = std::make_shared<opened_world>();
    r.ck = std::make_shared<checkpoint>(open_collective(at, opt, ranks, r.world.get()));
  } else {
    r.ck = std::make_shared<checkpoint>(checkpoint::open(at, opt));
  }
  return r;
}

// (name, source name, dtype, shape, bytes, file, offset) per tensor, in file
// order (the package makes its TensorInfo of them).
py::list tensor_list(const py_checkpoint& p) {
  py::list out;
  const auto& ck = *p.ck;
  for (const auto& t : ck.tensors())
    out.append(py::make_tuple(t.name, t.source_name, std::string(format::name(t.type)), t.shape, t.size, file_of(ck, t),
                              t.offset));
  return out;
}

py::dict inspect_checkpoint(const py_checkpoint& p) {
  const auto& ck = *p.ck;
  const auto cls = policy::classifier::deepseek();
  std::map<std::string, std::array<std::uint64_t, 2>> per_dtype, per_class;
  for (const auto& t : ck.tensors()) {
    const auto info = cls(policy::tensor_info::from(t));
    for (auto* m : {&per_dtype[std::string(format::name(t.type))], &per_class[std::string(policy::class_name(info.cls))]}) {
      (*m)[0] += 1;
      (*m)[1] += t.size;
    }
  }
  auto table = [](const auto& m) {
    py::dict d;
    for (const auto& [k, v] : m) {
      py::dict e;
      e["tensors"] = v[0];
      e["bytes"] = v[1];
      d[py::str(k)] = e;
    }
    return d;
  };
  py::dict j;
  j["location"] = ck.location();
  j["shards"] = ck.shards().size();
  j["tensor_count"] = ck.tensors().size();
  j["tensor_bytes"] = ck.tensor_bytes();
  j["header_bytes_read"] = ck.header_bytes_read();
  j["dtypes"] = table(per_dtype);
  j["classes"] = table(per_class);
  return j;
}

}  // namespace

std::string file_of(const checkpoint& ck, const tensor_ref& t) {
  return t.shard < ck.shards().size() ? ck.shards()[t.shard].uri : std::string();
}

void init_checkpoint(py::module_& m) {
  py::class_<py_checkpoint>(m, "Checkpoint")
      .def_property_readonly("location", [](const py_checkpoint& p) { return p.ck->location(); })
      .def_property_readonly("tensor_bytes", [](const py_checkpoint& p) { return p.ck->tensor_bytes(); })
      .def_property_readonly("header_bytes_read", [](const py_checkpoint& p) { return p.ck->header_bytes_read(); })
      .def_property_readonly("is_s3", &py_checkpoint::is_s3)
      .def("shards", [](const py_checkpoint& p) {
        py::list l;
        for (const auto& s : p.ck->shards()) l.append(py::make_tuple(s.name, s.uri));
        return l;
      })
      .def("select", [](const py_checkpoint& p, const std::vector<std::string>& names) {
        // A view over the named tensors of the same opened checkpoint: no
        // header is read again; a name it lacks is a config_error naming it.
        py_checkpoint sub = p;
        sub.ck = std::make_shared<checkpoint>(p.ck->select(std::set<std::string>(names.begin(), names.end())));
        return sub;
      }, py::arg("names"))
      .def("tensors", &tensor_list)
      .def("__len__", [](const py_checkpoint& p) { return p.ck->tensors().size(); })
      .def("inspect", &inspect_checkpoint);
  m.def(
      "name_rules",
      [](const std::vector<std::string>& names, std::optional<std::string> first, std::optional<std::string> last) {
        // The plan's own rules (policy/classify.hpp), for Python code that must
        // agree with the plan: never a copy of them in Python.
        policy::classify_options o;
        if (first) o.first_pp_stage_pattern = *first;
        if (last) o.last_pp_stage_pattern = *last;
        const policy::classifier c(o);
        py::list out;
        for (const auto& n : names) {
          policy::tensor_info t{n, 0, {}};
          c.layer(t);
          const auto a = c.anchor(t);
          out.append(py::make_tuple(t.layer < 0 ? py::object(py::none()) : py::object(py::int_(t.layer)),
                                    a == policy::pp_anchor::first ? "first" : a == policy::pp_anchor::last ? "last" : "every"));
        }
        return out;
      },
      py::arg("names"), py::arg("pp_first_pattern") = std::nullopt, py::arg("pp_last_pattern") = std::nullopt,
      "(layer or None, 'first' | 'last' | 'every') per name: the layer index and the pipeline stage a "
      "layer-less tensor goes with, by the plan's classifier (its default patterns unless given).");
  m.def("open_checkpoint", &open_checkpoint, py::arg("where"), py::arg("select_regex"), py::arg("select_fn"), py::arg("rename"),
        py::arg("index") = std::string(), py::arg("who") = nullptr,
        py::arg("limits") = std::map<std::string, std::uint64_t>{}, py::arg("cache") = std::string(),
        py::arg("cache_max") = 0);
  m.def("cache_stats", &cache_stats,
        "The node-local cache's counters in this process (the cache it used last), or None.");
}

}  // namespace sluice_py
