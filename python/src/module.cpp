// sluice._sluice: the module. Each concern binds itself in its own unit
// (bindings.hpp lists them); this one says what the build has and calls them
// in order: the exception classes first (every later binding may raise
// them), TensorItem and Checkpoint before the functions that take or return them.
#include "bindings.hpp"

PYBIND11_MODULE(_sluice, m) {
  using namespace sluice_py;
  m.doc() = "sluice: safetensors checkpoints into torch tensors (the compiled part; use the `sluice` package)";

  m.attr("components") = std::string(SLUICE_PY_COMPONENTS);
#if defined(SLUICE_HAS_S3)
  m.attr("has_s3") = true;
#else
  m.attr("has_s3") = false;
#endif
#if defined(SLUICE_HAS_GLOO)
  m.attr("has_gloo") = true;
#else
  m.attr("has_gloo") = false;
#endif
#if SLUICE_PY_CUDA
  m.attr("has_cuda") = true;  // load_into_cuda exists
#else
  m.attr("has_cuda") = false;
#endif

  init_errors(m);
  init_dlpack(m);
  init_checkpoint(m);
  init_stream(m);
  init_load_into(m);
  init_contract(m);
}
