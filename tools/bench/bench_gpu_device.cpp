// tier-bench-gpu's device figures (contracts in bench_gpu_device.hpp).
#include "bench_gpu_device.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

namespace tier::bench {
namespace {

// bf16 dense FLOP per clock per SM of the tensor cores, by compute capability.
double bf16_flops_per_clock_per_sm(int major, int minor) {
  if (major == 8 && minor == 0) return 2048;  // A100
  if (major == 8) return 1024;                // A10, L4, L40 (8.6, 8.7, 8.9)
  if (major == 9) return 4096;                // H100, H200, GH200
  if (major == 10) return 8192;               // B200, GB200
  return 0;
}

// Frees what the GEMM measurement allocated, whatever step it stopped at.
struct GemmBuffers {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cublasHandle_t blas = nullptr;
  ~GemmBuffers() {
    if (blas) (void)cublasDestroy(blas);
    if (start) (void)cudaEventDestroy(start);
    if (stop) (void)cudaEventDestroy(stop);
    (void)cudaFree(a);
    (void)cudaFree(b);
    (void)cudaFree(c);
  }
};

}  // namespace

double bf16_peak_tflops(int device) {
  int major = 0, minor = 0, sms = 0, khz = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<double>(sms) * bf16_flops_per_clock_per_sm(major, minor) * khz * 1e3 / 1e12;
}

double cublas_bf16_gemm_tflops(int device, int dim, int reps, std::string* error) {
  auto failed = [&](const char* what) {
    if (error) *error = what;
    (void)cudaGetLastError();
    return -1.0;
  };
  if (cudaSetDevice(device) != cudaSuccess) return failed("cudaSetDevice");
  GemmBuffers g;
  const size_t bytes = size_t(dim) * dim * sizeof(__nv_bfloat16);
  if (cudaMalloc(&g.a, bytes) != cudaSuccess || cudaMalloc(&g.b, bytes) != cudaSuccess ||
      cudaMalloc(&g.c, bytes) != cudaSuccess)
    return failed("cudaMalloc of the GEMM operands");
  // Small values (0x3c3c: bf16 0.0081) keep the sums finite; the rate does not depend on them.
  if (cudaMemset(g.a, 0x3c, bytes) != cudaSuccess || cudaMemset(g.b, 0x3c, bytes) != cudaSuccess)
    return failed("cudaMemset");
  if (cublasCreate(&g.blas) != CUBLAS_STATUS_SUCCESS) return failed("cublasCreate");
  if (cudaEventCreate(&g.start) != cudaSuccess || cudaEventCreate(&g.stop) != cudaSuccess)
    return failed("cudaEventCreate");
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&] {
    return cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, dim, dim, dim, &one, g.a, CUDA_R_16BF, dim, g.b,
                        CUDA_R_16BF, dim, &zero, g.c, CUDA_R_16BF, dim, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  };
  if (!gemm() || cudaDeviceSynchronize() != cudaSuccess) return failed("warm-up cublasGemmEx");
  float best_ms = -1;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    if (cudaEventRecord(g.start) != cudaSuccess || !gemm() || cudaEventRecord(g.stop) != cudaSuccess ||
        cudaEventSynchronize(g.stop) != cudaSuccess)
      return failed("cublasGemmEx");
    float ms = 0;
    if (cudaEventElapsedTime(&ms, g.start, g.stop) != cudaSuccess) return failed("cudaEventElapsedTime");
    if (best_ms < 0 || ms < best_ms) best_ms = ms;
  }
  return 2.0 * dim * dim * static_cast<double>(dim) / (best_ms / 1e3) / 1e12;
}

Result<TensorInfo> create_near_gpu(Client& c, const std::string& pool, TensorDesc desc, int device,
                                   const char* who) {
  desc.placement = Placement::near_gpu(device);
  auto t = c.create_tensor(pool, desc);
  if (t) return t;
  std::fprintf(stderr,
               "%s: warning: tierd placed nothing near GPU %d (%s); placing anywhere instead: the "
               "copies may cross sockets\n",
               who, device, t.error().to_string().c_str());
  desc.placement = Placement::any();
  return c.create_tensor(pool, desc);
}

}  // namespace tier::bench
