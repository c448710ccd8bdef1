// Shared by the GPU tests: a visible skip when this machine has no usable CUDA device.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// Deterministic values in [-a, a] (+ offset).
inline std::vector<float> random_floats(size_t n, uint64_t seed, float a = 1.0f, float offset = 0.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = offset + a * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return v;
}

// max |got - want| relative to max |want| (and to 1e-3 for all-small references).
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 1e-3;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return diff / scale;
}

}  // namespace tier::test
