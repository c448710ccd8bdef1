// The one place where CUDA runtime errors become tier::Status (host C++23 code only; the
// .cu kernels never see tier::Status).
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "tier/status.hpp"

namespace tier::gpu {

// cudaErrorNoDevice / cudaErrorInsufficientDriver / a missing driver → kUnsupported
// "no CUDA device: <context>: <cuda error>"; allocation failures → kResourceExhausted;
// invalid values → kInvalidArgument; everything else kInternal. Message: "context: name: text".
[[nodiscard]] Status from_cuda(cudaError_t err, std::string_view context);

// from_cuda() for a call's result that also clears the thread's last error, so a later
// cudaGetLastError() does not report the same failure again.
[[nodiscard]] inline Status check_cuda(cudaError_t err, std::string_view context) {
  if (err == cudaSuccess) return Status::ok();
  (void)cudaGetLastError();
  return from_cuda(err, context);
}

// True for the errors that mean "this machine has no usable GPU".
bool is_no_device(cudaError_t err) noexcept;

// Sets the calling thread's current device for a scope and restores the previous one, so a
// stager call never changes which device the caller's later CUDA calls go to.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t error() const noexcept { return err_; }

 private:
  int prev_ = -1;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace tier::gpu
