#include "cuda_status.hpp"

#include <fmt/format.h>

namespace tier::gpu {

bool is_no_device(cudaError_t err) noexcept {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice: return true;
    default: return false;
  }
}

Status from_cuda(cudaError_t err, std::string_view context) {
  if (err == cudaSuccess) return Status::ok();
  const std::string detail =
      fmt::format("{}: {}: {}", context, cudaGetErrorName(err), cudaGetErrorString(err));
  if (is_no_device(err)) return Status(Code::kUnsupported, "no CUDA device: " + detail);
  switch (err) {
    case cudaErrorMemoryAllocation:
    case cudaErrorHostMemoryAlreadyRegistered:  // callers handle it before; kept for safety
      return Status(Code::kResourceExhausted, detail);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorHostMemoryNotRegistered: return Status(Code::kInvalidArgument, detail);
    case cudaErrorNotSupported: return Status(Code::kUnsupported, detail);
    default: return Status(Code::kInternal, detail);
  }
}

DeviceGuard::DeviceGuard(int device) noexcept {
  err_ = cudaGetDevice(&prev_);
  if (err_ != cudaSuccess) {
    prev_ = -1;
    return;
  }
  if (prev_ != device) err_ = cudaSetDevice(device);
}

DeviceGuard::~DeviceGuard() {
  int cur = -1;
  if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
}

}  // namespace tier::gpu
