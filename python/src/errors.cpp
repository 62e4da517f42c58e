// sluice's exceptions in Python: one table, in the order of error.hpp's
// hierarchy (a class after its bases), makes the Python classes and the
// translator, which names each C++ error by its most derived class in it.
#include "bindings.hpp"

#include <string_view>
#include <vector>

#include <sluice/comm/concepts.hpp>
#if defined(SLUICE_HAS_S3)
#include <sluice/s3/error.hpp>  // s3_error's fields for Python
#endif
#if defined(SLUICE_HAS_CUDA)
#include <sluice/cuda/error.hpp>
#endif

namespace sluice_py {
namespace {

template <class E>
bool is_a(const error& e) {
  return dynamic_cast<const E*>(&e) != nullptr;
}

struct error_class {
  const char* name;
  const char* base;     ///< a class earlier in the table ("": builtins.Exception)
  const char* builtin;  ///< a builtin it also derives from ("ValueError", "OSError"), or ""
  const char* doc;
  bool (*is)(const error&);  ///< null: a class this build never raises (no S3, no CUDA)
};

#if defined(SLUICE_HAS_S3)
#define SLUICE_PY_S3(T) &is_a<T>
#else
#define SLUICE_PY_S3(T) nullptr
#endif
#if defined(SLUICE_HAS_CUDA)
#define SLUICE_PY_CUDA_ERROR &is_a<cuda::cuda_error>
#else
#define SLUICE_PY_CUDA_ERROR nullptr
#endif

const error_class classes[] = {
    {"Error", "", "", "Base of every sluice error; .detail, .file, .tensor, .range.", &is_a<error>},
    {"FormatError", "Error", "ValueError", "A malformed safetensors file (.rule names the rule).", &is_a<format_error>},
    {"IndexError", "FormatError", "", "A malformed or stale model.safetensors.index.json.", &is_a<index_error>},
    {"IOError", "Error", "OSError", "Reading failed (.code: errno or 0).", &is_a<io_error>},
    {"TruncatedError", "IOError", "", "A file is shorter than its header says.", &is_a<truncated_error>},
    {"CancelledError", "Error", "", "The load was stopped.", &is_a<cancelled_error>},
    {"ConfigError", "Error", "ValueError", "Invalid arguments or options.", &is_a<config_error>},
    {"ContractError", "Error", "", "A load contract is not met (names the keys).", &is_a<contract_error>},
    {"ResourceError", "Error", "", "Memory or another resource ran out (e.g. the staging budget).", &is_a<resource_error>},
    {"UsageError", "Error", "", "The API was used out of order, or the caller failed.", &is_a<usage_error>},
    {"DistributedError", "Error", "", "A rank failed (.failed_rank); raised on every rank.", &is_a<distributed_error>},
    {"CommError", "Error", "", "A communicator or rendezvous failed or timed out.", &is_a<comm::comm_error>},
    {"PeerLostError", "CommError", "", "A peer rank died (.lost_rank) while this one was in .phase.", &is_a<comm::peer_lost>},
    {"S3Error", "IOError", "", "An S3 request failed (.http_status, .s3_code).", SLUICE_PY_S3(s3_error)},
    {"S3NotFoundError", "S3Error", "", "An S3 bucket or object does not exist.", SLUICE_PY_S3(s3_not_found_error)},
    {"S3AccessError", "S3Error", "", "S3 refused the credentials.", SLUICE_PY_S3(s3_access_error)},
    {"S3ObjectChangedError", "S3Error", "", "An S3 object changed during the load (ETag).", SLUICE_PY_S3(s3_object_changed_error)},
    {"CudaError", "Error", "", "A CUDA call failed.", SLUICE_PY_CUDA_ERROR},
};
constexpr std::size_t class_count = sizeof(classes) / sizeof(classes[0]);

// The Python classes, by the table's index: made once at import, kept for the
// process (never freed: a translation may run while the interpreter exits).
PyObject* made[class_count] = {};

void set_python_error(PyObject* type, const error& e) {
  py::object exc = py::reinterpret_borrow<py::object>(type)(lenient_str(e.what()));
  exc.attr("detail") = lenient_str(e.detail());
  exc.attr("file") = lenient_str(e.file());
  exc.attr("tensor") = lenient_str(e.tensor());
  if (e.range()) exc.attr("range") = py::make_tuple(e.range()->begin, e.range()->end);
  else exc.attr("range") = py::none();
  if (const auto* f = dynamic_cast<const format_error*>(&e)) exc.attr("rule") = lenient_str(f->rule());
  if (const auto* d = dynamic_cast<const distributed_error*>(&e)) exc.attr("failed_rank") = d->failed_rank();
  if (const auto* io = dynamic_cast<const io_error*>(&e)) exc.attr("code") = io->code();
  if (const auto* l = dynamic_cast<const comm::peer_lost*>(&e)) {
    exc.attr("lost_rank") = l->lost_rank();
    exc.attr("phase") = lenient_str(l->phase());
  }
#if defined(SLUICE_HAS_S3)
  if (const auto* s = dynamic_cast<const s3_error*>(&e)) {
    exc.attr("http_status") = s->http_status();
    exc.attr("s3_code") = py::str(s->s3_code());
  }
#endif
  PyErr_SetObject(type, exc.ptr());
}

void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const error& e) {
    // A class comes after its bases: the last one that matches is the most derived.
    for (std::size_t i = class_count; i-- > 0;)
      if (classes[i].is && classes[i].is(e)) return set_python_error(made[i], e);
  }
}

}  // namespace

void init_errors(py::module_& m) {
  const auto builtins = py::module_::import("builtins");
  for (std::size_t i = 0; i < class_count; ++i) {
    const auto& c = classes[i];
    std::vector<py::object> bases;
    if (!*c.base) {
      bases.push_back(builtins.attr("Exception"));
    } else {
      for (std::size_t j = 0; j < i; ++j)
        if (std::string_view(classes[j].name) == c.base) bases.push_back(py::reinterpret_borrow<py::object>(made[j]));
    }
    if (*c.builtin) bases.push_back(builtins.attr(c.builtin));
    py::tuple b(bases.size());
    for (std::size_t k = 0; k < bases.size(); ++k) b[k] = bases[k];
    PyObject* e = PyErr_NewExceptionWithDoc((std::string("sluice.") + c.name).c_str(), c.doc, b.ptr(), nullptr);
    if (!e) throw py::error_already_set();
    made[i] = e;  // the reference is kept for the process
    m.attr(c.name) = py::reinterpret_borrow<py::object>(e);
  }
  py::register_exception_translator(&translate);
}

}  // namespace sluice_py
