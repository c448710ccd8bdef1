// Shared by the GPU tests: a visible skip when this machine has no usable CUDA device.
#pragma once

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <string>

namespace tier::test {

// True when a CUDA device can be used; otherwise prints why (Catch2 WARN, shown in the test
// output) so the caller can return: the test is skipped, visibly.
inline bool have_cuda_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    WARN("no CUDA device: skipping (" << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") << ")");
    return false;
  }
  return true;
}

}  // namespace tier::test
