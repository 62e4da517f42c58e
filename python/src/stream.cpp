// iter_weights' stream: StreamOptions (and the library's options made of
// them), Stream (the Python face of sluice::tensor_stream), plan_owners (the
// plan a distributed stream computes), parse_size, and the process's memory
// cache (release_memory, memory_stats).
#include "bindings.hpp"
#include "glue.hpp"

#include <algorithm>
#include <cstdlib>

#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include <sluice/core/size.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/memory/memory_cache.hpp>
#include <sluice/policy/classify.hpp>
#include <sluice/policy/plan.hpp>

using namespace std::chrono_literals;

namespace sluice_py {

namespace {

// The plan and classifier knobs of a distributed stream (the stream's load and
// sluice.plan_owners build them here alike).
distributed_options distributed_options_of(const py_stream_options& o) {
  distributed_options d;
  d.plan.local_size = o.local_size;
  d.plan.pp_stage_layers = o.pp_stage_layers;
  d.plan.experts = policy::parse_expert_placement(o.expert_placement);
  if (o.pp_first_pattern) d.classify.first_pp_stage_pattern = *o.pp_first_pattern;
  if (o.pp_last_pattern) d.classify.last_pp_stage_pattern = *o.pp_last_pattern;
  if (!o.model_owners.empty()) {
    auto owners = std::make_shared<std::map<std::string, policy::model_owner>>();
    for (const auto& [name, ranks] : o.model_owners) (*owners)[name].ranks = ranks;
    for (const auto& [name, split] : o.model_parts) {
      const auto it = owners->find(name);
      if (it == owners->end()) throw config_error(fmt::format("model_owners: a split of tensor '{}', which has no owners", name));
      const auto& [dim, parts, part, groups, run_rows] = split;
      if (dim > 1) throw config_error(fmt::format("model_owners: tensor '{}' split along dimension {} (0 or 1)", name, dim));
      if (groups == 0) throw config_error(fmt::format("model_owners: tensor '{}' split in 0 runs", name));
      it->second.split = dim == 0 ? policy::tp_split::rows : policy::tp_split::columns;
      it->second.parts = parts;
      it->second.part = part;
      it->second.groups = groups;
      it->second.run_rows = run_rows;
    }
    d.plan.model_owners = std::move(owners);
  }
  return d;
}

// The Python face of a tensor_stream (sluice/tensor_stream.hpp: the queue,
// the slot pins, the budget and the memory cache are the library's). next()
// waits with the GIL released, waking every 50 ms for Python's signals.
class stream {
 public:
  stream(py_checkpoint ck, py_stream_options o) : ck_(std::move(ck)), opt_(std::move(o)) {
    sluice::stream_options so;
    so.queue = std::max<std::size_t>(1, opt_.queue);
    if (opt_.exhausted == "raise") so.exhausted = on_exhausted::raise;
    else if (opt_.exhausted != "copy")
      throw config_error(fmt::format("on_exhausted='{}': expected 'copy' or 'raise'", opt_.exhausted));
    lopt_ = make_load_options(opt_);
    so.map_cached = opt_.map_cached;
    so.load = lopt_;
    // Another rank's tensor never reaches Python, but where this rank's
    // model still wants the call (stand_ins: a byte-less stand-in).
    if (!opt_.placeholders)
      so.skip = [this](const tensor_view& v) {
        return v.kind == view_kind::placeholder && !opt_.stand_ins.contains(v.name());
      };
    distributed_ = opt_.world_size > 1 || !opt_.topology.empty();
    if (!distributed_) {
      s_ = std::make_unique<tensor_stream>(ck_.ck, std::move(so));
    } else {
      s_ = std::make_unique<tensor_stream>([this](any_sink sink, const load_options& l) { distributed_body(sink, l); },
                                           std::move(so));
    }
  }
  ~stream() {
    py::gil_scoped_release nogil;  // a distributed load's store calls take the GIL
    s_.reset();                    // stops the load and waits for it
  }

  void start() { s_->start(); }

  // The next TensorItem, or None at the end. Raises the load's error, or
  // KeyboardInterrupt (after stopping the load).
  py::object next() {
    for (;;) {
      stream_tensor t;
      pull_status r;
      {
        py::gil_scoped_release nogil;
        r = s_->next(50ms, t);
      }
      if (r == pull_status::tensor) {
        tensor_view v = std::move(t.view);  // the capsule's deleter releases `t` (the pin, the budget) after the bytes
        return tensor_item(std::move(v), std::move(t));
      }
      if (r == pull_status::end) return py::none();
      if (PyErr_CheckSignals() != 0) {
        py::error_already_set interrupted;
        stop();
        throw interrupted;
      }
    }
  }

  // Stops the load and waits for it (every slot returned except those the
  // caller's tensors still hold).
  void stop() {
    py::gil_scoped_release nogil;
    s_->stop();
  }

  // The consumer failed: the load thread's next sink call throws `message`
  // (a distributed load then makes every rank raise, naming this one).
  void fail(const std::string& message) {
    py::gil_scoped_release nogil;
    s_->fail(std::make_exception_ptr(usage_error(fmt::format("the caller failed: {}", message))));
  }

  py::object stats() const {
    if (!s_->done()) return py::none();
    const auto st = s_->stats();
    py::dict d;
    if (distributed_) {
      std::lock_guard g(mu_);
      if (distributed_stats_.is_object()) d = py::dict(to_py(distributed_stats_));
    } else {
      d = local_stats(*ck_.ck, st.load, lopt_, s_->cpu_seconds());
      py::dict s;
      s["slot_size"] = st.plan.slot_size;
      s["pool_bytes"] = st.plan.pool_bytes;
      s["own_bytes"] = st.plan.own_bytes;
      s["own_min"] = st.plan.own_min;
      s["read_alone"] = st.read_alone;
      s["peak_ahead_bytes"] = st.peak_ahead_bytes;
      s["peak_own_bytes"] = st.peak_own_bytes;
      s["gate_waits"] = st.gate_waits;
      s["mapped_tensors"] = st.mapped_tensors;
      s["mapped_bytes"] = st.mapped_bytes;
      d["stream"] = s;
    }
    d["copied_out"] = st.copied_out;
    d["copied_out_bytes"] = st.copied_out_bytes;
    d["own_tensors"] = st.own_tensors;
    d["own_tensor_bytes"] = st.own_tensor_bytes;
    return d;
  }
  py::tuple progress() const {
    const auto& p = s_->progress();
    return py::make_tuple(p.bytes_done.load(), p.total_bytes.load(), p.tensors_done.load(), p.total_tensors.load());
  }
  py::tuple staging_region() const {
    const auto* pool = s_->pool();
    if (!pool) return py::make_tuple(0, 0, 0);
    const auto r = pool->region();
    return py::make_tuple(reinterpret_cast<std::uintptr_t>(r.data()), r.size(), pool->slot_size());
  }
  py::tuple slots() const {
    const auto* pool = s_->pool();
    return py::make_tuple(pool ? pool->slot_count() : 0, pool ? pool->free_count() : 0, s_->pinned_slots());
  }

 private:
  void distributed_body(any_sink sink, const load_options& l) {
    distributed_request req;
    req.topology = opt_.topology.empty() ? fmt::format("tp1,dp{}", opt_.world_size) : opt_.topology;
    req.offload = opt_.offload;
    req.who = rank_info_of(opt_);
    auto d = distributed_options_of(opt_);
    d.load = l;
    auto j = run_distributed(*ck_.ck, req, sink, d, ck_.world ? ck_.world->take(req.who) : nullptr);
    std::lock_guard g(mu_);
    distributed_stats_ = std::move(j);
  }

  py_checkpoint ck_;
  py_stream_options opt_;
  load_options lopt_;
  bool distributed_ = false;
  mutable std::mutex mu_;
  nlohmann::json distributed_stats_;
  std::unique_ptr<tensor_stream> s_;
};

}  // namespace

load_options make_load_options(const py_stream_options& o) {
  load_options l;
  l.staging_budget = o.staging;
  l.max_read = o.max_read;
  l.queue_depth = o.queue_depth;
  l.threads = o.threads;
  if (!o.prefault) l.prefault_above = 0;
  if (o.io == "direct") l.io = io_mode::direct;
  else if (o.io == "buffered") l.io = io_mode::buffered;
  else if (o.io != "auto") throw config_error(fmt::format("io='{}': expected 'auto', 'direct' or 'buffered'", o.io));
  return l;
}

comm::rank_info rank_info_of(const py_stream_options& o) {
  comm::rank_info who;
  who.rank = o.rank;
  who.world_size = o.world_size;
  who.local_rank = o.local_rank;
  who.local_size = o.local_size;
  who.timeout = std::chrono::milliseconds(o.timeout_ms);
  who.kv = o.kv;
  who.kv_prefix = o.kv_prefix;
  if (const char* h = std::getenv("SLUICE_GLOO_HOST"); h && *h) who.hostname = h;
  else if (!o.host.empty()) who.hostname = o.host;
  return who;
}

void init_stream(py::module_& m) {
  m.def("release_memory", [] { memory_cache::process().release(); },
        "Frees the staging pool and tensor buffers kept between loads for the next one to reuse.");
  m.def("memory_stats", [] {
    const auto c = memory_cache::process().stats();
    py::dict d;
    d["idle_pool_bytes"] = c.idle_pool_bytes;
    d["idle_buffer_bytes"] = c.idle_buffer_bytes;
    d["reused_pools"] = c.reused_pools;
    d["reused_buffers"] = c.reused_buffers;
    return d;
  }, "What is kept between loads, and how often it was reused.");
  m.def("parse_size", [](const std::string& s) { return sluice::parse_size(s); }, py::arg("text"),
        "Bytes from a size such as '4GiB' (sluice/core/size.hpp: K/KiB... powers of 1024, KB/MB/GB/TB of 1000).");

  py::class_<py_stream_options>(m, "StreamOptions")
      .def(py::init<>())
      .def_readwrite("staging", &py_stream_options::staging)
      .def_readwrite("max_read", &py_stream_options::max_read)
      .def_readwrite("queue_depth", &py_stream_options::queue_depth)
      .def_readwrite("threads", &py_stream_options::threads)
      .def_readwrite("io", &py_stream_options::io)
      .def_readwrite("on_exhausted", &py_stream_options::exhausted)
      .def_readwrite("map_cached", &py_stream_options::map_cached)
      .def_readwrite("placeholders", &py_stream_options::placeholders)
      .def_readwrite("stand_ins", &py_stream_options::stand_ins)
      .def_readwrite("model_owners", &py_stream_options::model_owners)
      .def_readwrite("model_parts", &py_stream_options::model_parts)
      .def_readwrite("prefault", &py_stream_options::prefault)
      .def_readwrite("queue", &py_stream_options::queue)
      .def_readwrite("topology", &py_stream_options::topology)
      .def_readwrite("offload", &py_stream_options::offload)
      .def_readwrite("rank", &py_stream_options::rank)
      .def_readwrite("world_size", &py_stream_options::world_size)
      .def_readwrite("local_rank", &py_stream_options::local_rank)
      .def_readwrite("local_size", &py_stream_options::local_size)
      .def_readwrite("kv_prefix", &py_stream_options::kv_prefix)
      .def_readwrite("timeout_ms", &py_stream_options::timeout_ms)
      .def_readwrite("host", &py_stream_options::host)
      .def_readwrite("pp_stage_layers", &py_stream_options::pp_stage_layers)
      .def_readwrite("pp_first_pattern", &py_stream_options::pp_first_pattern)
      .def_readwrite("pp_last_pattern", &py_stream_options::pp_last_pattern)
      .def_readwrite("expert_placement", &py_stream_options::expert_placement)
      .def("set_store", [](py_stream_options& o, py::object store) { o.kv = torch_store(std::move(store)); },
           "The rendezvous store of a distributed load: a torch.distributed store, or None.");

  m.def("plan_owners", [](const py_checkpoint& p, const py_stream_options& o) {
        // The plan a distributed stream with these options computes (topology,
        // offload, PP split, classifier patterns), as the tensors each rank owns.
        const auto d = distributed_options_of(o);
        const auto plan = policy::make_plan(policy::tensor_infos(*p.ck), policy::classifier(d.classify),
                                            policy::parse_topology(o.topology), policy::parse_offload(o.offload), d.plan);
        std::vector<std::vector<std::string>> owned(plan.world);
        for (const auto& e : plan.entries)
          for (auto r : e.owners.members()) owned[r].push_back(e.info.name);
        return owned;
      }, py::arg("checkpoint"), py::arg("options"));

  py::class_<stream>(m, "Stream")
      .def(py::init<py_checkpoint, py_stream_options>())
      .def("start", &stream::start)
      .def("next", &stream::next)
      .def("stop", &stream::stop)
      .def("fail", &stream::fail)
      .def("stats", &stream::stats)
      .def("progress", &stream::progress)
      .def("staging_region", &stream::staging_region)
      .def("slots", &stream::slots);
}

}  // namespace sluice_py
