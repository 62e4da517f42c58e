// Tensors as they cross into Python: TensorItem (name, DLPack capsule,
// dtype, shape, kind, TP part, source name) and the capsule itself.
//
// Leases: a capsule's deleter drops the view's lease (returning its staging
// slot when it was the last one) and then the stream's tensor (its pin, its
// share of the budget). Deleters never touch Python, so torch may run them on
// any thread.
#include "bindings.hpp"

#include <span>

#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

namespace sluice_py {

namespace {

// How a sluice dtype travels through DLPack to torch: types without a DLPack
// code of their own travel as the integer type of their width (BOOL as
// uint8, U16-U64 as int16-int64, F8 as uint8 of the same shape, F4/F6 as a
// flat uint8 of the bytes); the Python side (_torch.py) views or labels them.
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
                         const std::vector<std::uint64_t>& shape, stream_tensor owner) {
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

// sluice.TensorItem: read-only, made only here.
struct item {
  std::string name;
  py::object capsule;  // a DLPack capsule, or None
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::string kind;
  py::object part;  // (dim, index, count), or None
  std::string source_name;
  bool holds_staging = false;  // keeping it holds a stream's slot or budget (stream_tensor::holds_staging)
};

}  // namespace

py::object tensor_item(tensor_view v, stream_tensor owner) {
  if (v.kind == view_kind::device) throw config_error("a device view reached the host package", {"", v.name()});
  item it;
  it.name = v.name();
  it.dtype = std::string(format::name(v.dtype()));
  it.shape = v.part_shape();
  it.kind = kind_name(v.kind);
  it.part = !v.is_part()          ? py::object(py::none())
            : v.part.groups > 1 ? py::object(py::make_tuple(v.part.dim, v.part.index, v.part.count, v.part.groups))
                                : py::object(py::make_tuple(v.part.dim, v.part.index, v.part.count));
  it.source_name = v.tensor->source_name;
  it.holds_staging = owner.holds_staging();
  it.capsule = v.carries_data() ? py::object(make_capsule(v.bytes, std::move(v.hold), v.dtype(), it.shape, std::move(owner)))
                                : py::none();
  return py::cast(std::move(it));
}

void init_dlpack(py::module_& m) {
  py::class_<item>(m, "TensorItem",
                   "A tensor as the extension hands it out (Stream.next, a weight loader's argument); "
                   "sluice._torch.tensor_from makes the torch tensor.")
      .def_readonly("name", &item::name, "The name engines see (after renaming).")
      .def_readonly("capsule", &item::capsule,
                    "A DLPack capsule over the bytes (consumed once), or None where there are none (a placeholder).")
      .def_readonly("dtype", &item::dtype, "The safetensors dtype name, e.g. 'BF16', 'F8_E4M3'.")
      .def_readonly("shape", &item::shape, "The shape of this rank's part (the whole tensor's when not split).")
      .def_readonly("kind", &item::kind, "'bytes', 'placed', 'metadata', 'shared' or 'placeholder'.")
      .def_readonly("part", &item::part,
                    "(dim, index, count) of this rank's TP part, (dim, index, count, groups) for its block of each of "
                    "`groups` runs of dim (a fused tensor), or None.")
      .def_readonly("source_name", &item::source_name, "The name in the file.")
      .def_readonly("holds_staging", &item::holds_staging,
                    "Whether keeping the tensor holds its stream's staging (a slot or budget); "
                    "False for a page-cache view, which may be kept for good.")
      .def("__repr__", [](const item& i) {
        return "<sluice.TensorItem " + std::string(py::repr(py::str(i.name))) + " " + i.dtype + " " +
               std::string(py::str(py::cast(i.shape))) + " " + i.kind + ">";
      });
}

}  // namespace sluice_py
