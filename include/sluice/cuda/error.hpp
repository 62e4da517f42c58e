#pragma once
/// \file
/// Checked CUDA runtime calls. Every call sluice makes goes through `check`,
/// which turns a failure into `cuda_error`: the call's name, the runtime's
/// error name, code and text, and the tensor (or file) it was about.
///
///   check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync", {"", tensor_name});
///   // → "cudaMemcpyAsync failed: cudaErrorInvalidValue (1): invalid argument (tensor 'w')"

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::cuda {

/// "cudaErrorInsufficientDriver (35): CUDA driver version is insufficient ..."
[[nodiscard]] inline std::string describe(cudaError_t e) {
  const char* name = ::cudaGetErrorName(e);
  const char* text = ::cudaGetErrorString(e);
  return fmt::format("{} ({}): {}", name ? name : "cudaError?", static_cast<int>(e), text ? text : "unknown error");
}

/// A CUDA runtime call failed. `call()` names it, `code()` is its cudaError_t.
class cuda_error : public error {
 public:
  cuda_error(std::string call, cudaError_t code, error_context ctx = {})
      : error(fmt::format("{} failed: {}", call, describe(code)), std::move(ctx)), call_(std::move(call)), code_(code) {}
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  std::string call_;
  cudaError_t code_;
};

/// Throws cuda_error unless `e` is cudaSuccess. Clears the runtime's
/// last-error state first, so a non-sticky failure does not leak into the
/// next unrelated check.
inline void check(cudaError_t e, std::string_view call, error_context ctx = {}) {
  if (e == cudaSuccess) return;
  (void)::cudaGetLastError();
  throw cuda_error(std::string(call), e, std::move(ctx));
}

}  // namespace sluice::inline v0::cuda

/// Checks a CUDA runtime call, naming it by its own text: SLUICE_CUDA_CHECK(cudaFree(p)).
#define SLUICE_CUDA_CHECK(expr, ...) ::sluice::cuda::check((expr), #expr __VA_OPT__(, ) __VA_ARGS__)
