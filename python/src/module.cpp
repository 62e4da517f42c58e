// sluice._sluice: the Python bindings. Python-facing behaviour (argument
// parsing, torch dtypes, progress bars, the rendezvous store) lives in the
// package's .py files; this file owns the threads, the GIL and the leases.
//
// Threads and the GIL: every load runs on a C++ thread of its own, with the
// GIL released by the Python thread that waits for it; that thread wakes up
// every 50 ms to run Python's signal handlers (Ctrl-C requests the load's
// stop token and the load ends with every slot returned). Python code called
// from a load thread (weight loaders of a reload session) takes the GIL.
//
// Leases: a tensor handed to Python is a DLPack capsule whose deleter drops
// the view's lease (returning its staging slot when it was the last one).
// Deleters never touch Python, so torch may run them on any thread.
#include "glue.hpp"

#include <sys/resource.h>

#include <cstring>
#include <functional>
#include <regex>
#include <set>
#include <thread>

#include <dlpack/dlpack.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sluice/core/size.hpp>
#include <sluice/load_file.hpp>
#include <sluice/memory_cache.hpp>
#include <sluice/tensor_stream.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/manifest/reload.hpp>
#include <sluice/policy/classify.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/probe.hpp>
#include <sluice/sink/host_sink.hpp>

namespace py = pybind11;
using namespace std::chrono_literals;

namespace sluice_py {

namespace {

// ---- running a blocking call interruptibly --------------------------------------

// Runs f() on a thread of its own while this (Python) thread waits with the
// GIL released, waking every 50 ms to run Python's signal handlers: a
// KeyboardInterrupt requests `stop`, waits for f to end (it ends promptly
// with cancelled_error, every slot returned) and is re-raised.
// `tick`, where given, runs with the GIL held at each wake (a progress callback).
template <class F>
auto run_interruptible(std::stop_source& stop, F f, const std::function<void()>& tick = {}) -> decltype(f()) {
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

// ---- sizes, rusage ------------------------------------------------------------------

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
std::uint64_t peak_rss() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;
}

// ---- checkpoints --------------------------------------------------------------------------

struct py_checkpoint {
  std::shared_ptr<const checkpoint> ck;  // keeps the catalog it was opened through (an S3 one pins ETags)
  bool s3 = false;
  bool is_s3() const { return s3; }
};

struct py_stream_options;
comm::rank_info rank_info_of(const py_stream_options& o);

// `who`: None, or the StreamOptions of a distributed load (rank, world, local
// ranks, store, timeout) whose ranks open the checkpoint together: rank 0
// reads the metadata and the others replay it (open_collective).
py_checkpoint open_checkpoint(const std::string& where, py::object select_regex, py::object select_fn,
                              const std::vector<std::pair<std::string, std::string>>& rename, const std::string& index,
                              const py_stream_options* who) {
  open_options opt;
  if (!index.empty()) opt.index = index;
  for (const auto& [from, to] : rename) opt.rename.push_back({from, to});
  if (!select_regex.is_none()) {
    const auto pattern = select_regex.cast<std::string>();
    std::shared_ptr<std::regex> re;
    try {
      re = std::make_shared<std::regex>(pattern, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      throw config_error(fmt::format("select: '{}' is not a valid regular expression: {}", pattern, e.what()));
    }
    opt.select = [re](std::string_view n) { return std::regex_search(n.begin(), n.end(), *re); };
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
  // A path, or an s3:// URI (its catalog reads the environment's S3 config).
  const location at(where);
  py_checkpoint r;
  r.s3 = !at.local();
  if (const auto ranks = who ? rank_info_of(*who) : comm::rank_info{}; ranks.world_size > 1) {
    py::gil_scoped_release nogil;
    r.ck = std::make_shared<checkpoint>(open_collective(at, opt, ranks));
  } else {
    r.ck = std::make_shared<checkpoint>(checkpoint::open(at, opt));
  }
  return r;
}

std::string file_of(const checkpoint& ck, const tensor_ref& t) {
  return t.shard < ck.shards().size() ? ck.shards()[t.shard].uri : std::string();
}

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

// ---- DLPack ---------------------------------------------------------------------------------

// How a sluice dtype travels through DLPack to torch. Types torch 1.13 lacks
// travel as the integer type of their width (BOOL as uint8, U16-U64 as
// int16-int64, F8 as uint8 of the same shape, F4/F6 as a flat uint8 of the
// bytes); the Python side views or labels them.
DLDataType dl_type(format::dtype t) {
  using format::dtype;
  switch (t) {
    case dtype::BF16: return {kDLBfloat, 16, 1};
    case dtype::F16: return {kDLFloat, 16, 1};
    case dtype::F32: return {kDLFloat, 32, 1};
    case dtype::F64: return {kDLFloat, 64, 1};
    case dtype::C64: return {kDLComplex, 64, 1};
    case dtype::I8: return {kDLInt, 8, 1};
    case dtype::I16: case dtype::U16: return {kDLInt, 16, 1};
    case dtype::I32: case dtype::U32: return {kDLInt, 32, 1};
    case dtype::I64: case dtype::U64: return {kDLInt, 64, 1};
    default: return {kDLUInt, 8, 1};  // U8, BOOL, F8_*, F6_*, F4
  }
}

struct dl_holder {
  DLManagedTensor managed{};
  stream_tensor owner;  // a stream's tensor: its slot pin and budget, released after `hold` (declared after it)
  lease hold;
  std::vector<std::int64_t> shape;
};

void dl_delete(DLManagedTensor* m) { delete static_cast<dl_holder*>(m->manager_ctx); }

void capsule_delete(PyObject* cap) {
  // Consumed capsules are renamed "used_dltensor" by torch, which then owns the tensor.
  if (PyCapsule_IsValid(cap, "dltensor"))
    if (auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"))) m->deleter(m);
}

alignas(64) std::byte empty_bytes[64];

// A capsule over `bytes` (kept alive by `hold`) with `shape` (the part's shape).
py::capsule make_capsule(std::span<const std::byte> bytes, lease hold, format::dtype type,
                         const std::vector<std::uint64_t>& shape, stream_tensor owner = {}) {
  auto h = std::make_unique<dl_holder>();
  h->hold = std::move(hold);
  h->owner = std::move(owner);
  const auto bits = format::bits(type);
  if (bits % 8 != 0) {
    h->shape = {static_cast<std::int64_t>(bytes.size())};  // packed sub-byte elements: the bytes
  } else {
    for (auto d : shape) h->shape.push_back(static_cast<std::int64_t>(d));
  }
  auto& t = h->managed.dl_tensor;
  t.data = bytes.empty() ? static_cast<void*>(empty_bytes) : const_cast<std::byte*>(bytes.data());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int>(h->shape.size());
  t.dtype = dl_type(type);
  t.shape = h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  h->managed.manager_ctx = h.get();
  h->managed.deleter = dl_delete;
  DLManagedTensor* m = &h->managed;
  PyObject* cap = PyCapsule_New(m, "dltensor", capsule_delete);
  if (!cap) throw py::error_already_set();
  h.release();  // owned by the capsule now (then by torch)
  return py::reinterpret_steal<py::capsule>(cap);
}

const char* kind_name(view_kind k) {
  switch (k) {
    case view_kind::bytes: return "bytes";
    case view_kind::placed: return "placed";
    case view_kind::metadata: return "metadata";
    case view_kind::shared: return "shared";
    case view_kind::device: return "device";
    case view_kind::placeholder: return "placeholder";
  }
  return "?";
}

// (name, capsule or None, dtype, part shape, kind, (dim, index, count) or None, source name)
py::tuple view_tuple(tensor_view v, stream_tensor owner = {}) {
  if (v.kind == view_kind::device) throw config_error("a device view reached the host package", {"", v.name()});
  py::object part = v.is_part() ? py::object(py::make_tuple(v.part.dim, v.part.index, v.part.count)) : py::none();
  const auto shape = v.part_shape();
  py::object cap = py::none();
  if (v.carries_data()) cap = make_capsule(v.bytes, std::move(v.hold), v.dtype(), shape, std::move(owner));
  return py::make_tuple(v.name(), cap, std::string(format::name(v.dtype())), shape, kind_name(v.kind), part,
                        v.tensor->source_name);
}

// ---- streams: iter_weights ----------------------------------------------------------------------

struct py_stream_options {
  std::size_t staging = std::size_t{4} << 30;
  std::uint64_t max_read = std::uint64_t{32} << 20;
  unsigned queue_depth = 4;
  unsigned threads = 1;
  std::string io = "auto";
  std::string exhausted = "copy";
  std::size_t queue = 8;
  // distributed (world_size > 1 or a topology)
  std::string topology, offload = "none";
  std::size_t rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  std::shared_ptr<comm::kv_store> kv;
  std::string kv_prefix;
  std::uint64_t timeout_ms = 60000;
  // PP > 1: layers per stage (empty: the plan's even split) and the patterns of
  // the layer-less tensors that go with the first / last stage (unset: the classifier's).
  std::vector<std::size_t> pp_stage_layers;
  std::optional<std::string> pp_first_pattern, pp_last_pattern;
  std::string expert_placement = "linear";  // or "round_robin" (policy::parse_expert_placement)
};

// The plan and classifier knobs of a distributed stream (the stream's load and
// sluice.plan_owners build them here alike).
distributed_options distributed_options_of(const py_stream_options& o) {
  distributed_options d;
  d.plan.local_size = o.local_size;
  d.plan.pp_stage_layers = o.pp_stage_layers;
  d.plan.experts = policy::parse_expert_placement(o.expert_placement);
  if (o.pp_first_pattern) d.classify.first_pp_stage_pattern = *o.pp_first_pattern;
  if (o.pp_last_pattern) d.classify.last_pp_stage_pattern = *o.pp_last_pattern;
  return d;
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
  return who;
}

load_options make_load_options(const py_stream_options& o) {
  load_options l;
  l.staging_budget = o.staging;
  l.max_read = o.max_read;
  l.queue_depth = o.queue_depth;
  l.threads = o.threads;
  if (o.io == "direct") l.io = io_mode::direct;
  else if (o.io == "buffered") l.io = io_mode::buffered;
  else if (o.io != "auto") throw config_error(fmt::format("io='{}': expected 'auto', 'direct' or 'buffered'", o.io));
  return l;
}

nlohmann::json local_stats(const checkpoint& ck, const load_stats& st, const load_options& opt, double cpu) {
  const double gib = static_cast<double>(st.tensor_bytes) / double(1ull << 30);
  nlohmann::json j = st.to_json();  // the names sluice-load --json prints
  j["source"] = ck.location();
  j["shards"] = ck.shards().size();
  j["staging"]["budget"] = opt.staging_budget;
  j["cpu_seconds"] = cpu;
  j["cpu_seconds_per_gib"] = gib > 0 ? cpu / gib : 0;
  j["peak_rss_bytes"] = peak_rss();
  return j;
}

load_stats run_local(const py_checkpoint& p, any_sink s, staging_pool& pool, load_options opt) {
  return load(*p.ck, s, pool, std::move(opt));  // through the catalog the checkpoint came from
}

py::object to_py(const nlohmann::json& j) {
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static auto* loads = new py::object(py::module_::import("json").attr("loads"));
  return (*loads)(j.dump());
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
    so.load = lopt_;
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

  // The next tensor tuple, or None at the end. Raises the load's error, or
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
        return view_tuple(std::move(v), std::move(t));
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
    nlohmann::json j;
    if (distributed_) {
      std::lock_guard g(mu_);
      j = distributed_stats_;
    } else {
      j = local_stats(*ck_.ck, st.load, lopt_, s_->cpu_seconds());
      j["stream"] = {{"slot_size", st.plan.slot_size}, {"pool_bytes", st.plan.pool_bytes}, {"own_bytes", st.plan.own_bytes},
                     {"own_min", st.plan.own_min}, {"read_alone", st.read_alone}, {"peak_ahead_bytes", st.peak_ahead_bytes},
                     {"peak_own_bytes", st.peak_own_bytes}, {"gate_waits", st.gate_waits}};
    }
    j["copied_out"] = st.copied_out;
    j["copied_out_bytes"] = st.copied_out_bytes;
    j["own_tensors"] = st.own_tensors;
    j["own_tensor_bytes"] = st.own_tensor_bytes;
    return to_py(j);
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
    auto j = run_distributed(*ck_.ck, req, sink, d);
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

// ---- load_into --------------------------------------------------------------------------------

// `progress`, where not None, is called as progress(bytes_done, bytes_total)
// from this thread (the GIL held) every 50 ms while the load runs, and once at
// the end.
py::object load_into(const py_checkpoint& p, const std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>& dst,
                     const py_stream_options& o, const py::object& progress) {
  std::set<std::string> names;
  for (const auto& [name, ptr, size] : dst) names.insert(name);
  auto sub = std::make_shared<py_checkpoint>(p);
  sub->ck = std::make_shared<checkpoint>(p.ck->select(names));  // config_error names a missing tensor
  host_sink sink({.allocate = false});
  for (const auto& [name, ptr, size] : dst) {
    const auto* t = sub->ck->find(name);
    if (t && t->size != size)
      throw config_error(fmt::format("the destination holds {} bytes, the tensor {}", size, t->size), {file_of(*sub->ck, *t), name});
    sink.set_destination(name, {reinterpret_cast<std::byte*>(ptr), static_cast<std::size_t>(size)});
  }
  auto lopt = make_load_options(o);
  std::stop_source stop;
  lopt.stop = stop.get_token();
  load_progress live;
  std::function<void()> tick;
  if (!progress.is_none()) {
    lopt.progress = &live;
    tick = [&] { progress(live.bytes_done.load(), sub->ck->tensor_bytes()); };
  }
  const double cpu0 = cpu_seconds();
  auto st = run_interruptible(
      stop,
      [&] {
        staging_pool pool(staging_options{.budget = lopt.staging_budget, .slot_size = slot_size_for(lopt.max_read)});
        return run_local(*sub, sink, pool, lopt);
      },
      tick);
  if (tick) tick();
  return to_py(local_stats(*sub->ck, st, lopt, cpu_seconds() - cpu0));
}

#if SLUICE_PY_CUDA
// The same into CUDA tensors of one device: destinations are device addresses.
py::object load_into_cuda(const py_checkpoint& p, const std::vector<std::tuple<std::string, std::uintptr_t, std::uint64_t>>& dst,
                          int device, const py_stream_options& o) {
  std::set<std::string> names;
  for (const auto& [name, ptr, size] : dst) names.insert(name);
  const checkpoint sub = p.ck->select(names);  // config_error names a missing tensor
  std::vector<device_destination> where;
  for (const auto& [name, ptr, size] : dst) {
    const auto* t = sub.find(name);
    if (t && t->size != size)
      throw config_error(fmt::format("the destination holds {} bytes, the tensor {}", size, t->size), {file_of(sub, *t), name});
    where.push_back({name, ptr, size});
  }
  auto lopt = make_load_options(o);
  std::stop_source stop;
  lopt.stop = stop.get_token();
  const double cpu0 = cpu_seconds();
  auto st = run_interruptible(stop, [&] { return load_into_device(sub, where, device, lopt); });
  return to_py(local_stats(sub, st, lopt, cpu_seconds() - cpu0));
}
#endif

// ---- the load contract ------------------------------------------------------------------------

// A Python weight loader as a C++ one. `adapter(name, tensor_tuple_or_tensor,
// source)` (the package's Python side) calls the engine's loader and returns
// (accepted, [(destination, {selector: value})]). Called with the GIL taken,
// from whichever thread the load calls its sink on.
struct py_loader {
  py::object adapter;
  std::shared_ptr<py::object> current;  // a tensor the caller already has (Recorder.__call__), else None

  bool operator()(tensor_view v, manifest::application_log& log) {
    py::gil_scoped_acquire gil;
    py::object arg;
    if (current && !current->is_none()) arg = *current;
    else arg = view_tuple(std::move(v));
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
}  // namespace sluice_py

using namespace sluice_py;

PYBIND11_MODULE(_sluice, m) {
  m.doc() = "sluice: safetensors checkpoints into torch tensors (the compiled part; use the `sluice` package)";

  init_errors(m);  // errors.cpp: one hierarchy under sluice.Error, from one table mirroring error.hpp

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
  m.attr("has_s3") =
#if defined(SLUICE_HAS_S3)
      true;
#else
      false;
#endif
  m.attr("has_gloo") =
#if defined(SLUICE_HAS_GLOO)
      true;
#else
      false;
#endif
  m.attr("components") = std::string(SLUICE_PY_COMPONENTS);
  m.def("parse_size", [](const std::string& s) { return sluice::parse_size(s); }, py::arg("text"),
        "Bytes from a size such as '4GiB' (sluice/core/size.hpp: K/KiB... powers of 1024, KB/MB/GB/TB of 1000).");

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
      .def("inspect", &inspect_checkpoint);
  m.def("open_checkpoint", &open_checkpoint, py::arg("where"), py::arg("select_regex"), py::arg("select_fn"), py::arg("rename"),
        py::arg("index") = std::string(), py::arg("who") = nullptr);

  py::class_<py_stream_options>(m, "StreamOptions")
      .def(py::init<>())
      .def_readwrite("staging", &py_stream_options::staging)
      .def_readwrite("max_read", &py_stream_options::max_read)
      .def_readwrite("queue_depth", &py_stream_options::queue_depth)
      .def_readwrite("threads", &py_stream_options::threads)
      .def_readwrite("io", &py_stream_options::io)
      .def_readwrite("on_exhausted", &py_stream_options::exhausted)
      .def_readwrite("queue", &py_stream_options::queue)
      .def_readwrite("topology", &py_stream_options::topology)
      .def_readwrite("offload", &py_stream_options::offload)
      .def_readwrite("rank", &py_stream_options::rank)
      .def_readwrite("world_size", &py_stream_options::world_size)
      .def_readwrite("local_rank", &py_stream_options::local_rank)
      .def_readwrite("local_size", &py_stream_options::local_size)
      .def_readwrite("kv_prefix", &py_stream_options::kv_prefix)
      .def_readwrite("timeout_ms", &py_stream_options::timeout_ms)
      .def_readwrite("pp_stage_layers", &py_stream_options::pp_stage_layers)
      .def_readwrite("pp_first_pattern", &py_stream_options::pp_first_pattern)
      .def_readwrite("pp_last_pattern", &py_stream_options::pp_last_pattern)
      .def_readwrite("expert_placement", &py_stream_options::expert_placement)
      .def("set_store", [](py_stream_options& o, py::object store) {
        // A torch.distributed store (anything with set(key, bytes), get(key) -> bytes, wait(keys);
        // delete_key(key), where it has one, removes the rendezvous keys once the ranks have met).
        struct torch_kv final : comm::kv_store {
          py::object store;
          explicit torch_kv(py::object s) : store(std::move(s)) {}
          ~torch_kv() override {
            py::gil_scoped_acquire gil;
            store = py::object();
          }
          void set(const std::string& key, const std::vector<char>& value) override {
            py::gil_scoped_acquire gil;
            store.attr("set")(key, py::bytes(value.data(), value.size()));
          }
          std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
            wait({key}, timeout);
            py::gil_scoped_acquire gil;
            const std::string v = store.attr("get")(key).cast<py::bytes>();
            return {v.begin(), v.end()};
          }
          void erase(const std::string& key) override {
            py::gil_scoped_acquire gil;
            try {
              store.attr("delete_key")(key);
            } catch (py::error_already_set&) {  // a store without delete_key keeps the key
            }
          }
          void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
            py::gil_scoped_acquire gil;
            try {
              static auto* timedelta = new py::object(py::module_::import("datetime").attr("timedelta"));  // leaked: see to_py
              store.attr("wait")(keys, (*timedelta)(py::arg("milliseconds") = timeout.count()));
            } catch (py::error_already_set& e) {
              throw comm::comm_error(fmt::format("store: waiting for '{}' failed: {}", keys.empty() ? "" : keys.front(), e.what()));
            }
          }
        };
        o.kv = store.is_none() ? nullptr : std::make_shared<torch_kv>(std::move(store));
      });

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

  m.def("load_into", &load_into, py::arg("ck"), py::arg("dst"), py::arg("options"), py::arg("progress") = py::none());
#if SLUICE_PY_CUDA
  m.def("load_into_cuda", &load_into_cuda);
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif

  py::class_<manifest::contract>(m, "Contract")
      .def(py::init<std::string>(), py::arg("layer_pattern") = std::string(manifest::default_layer_pattern))
      .def_static("from_json", [](const std::string& s) {
        try {
          return manifest::contract::from_json(nlohmann::json::parse(s));
        } catch (const nlohmann::json::exception& e) {
          throw contract_error(fmt::format("contract JSON: {}", e.what()));
        }
      })
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
        return to_py(local_stats(*p.ck, st, lopt, cpu_seconds() - cpu0));
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
