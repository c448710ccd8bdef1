// tier-bench-gpu's device figures: the dense bf16 tensor-core peak of a device, from its
// compute capability, SM count and peak clock, and the bf16 GEMM rate cuBLAS reaches on it
// (the denominators the GPU check puts beside tier-train's TFLOP/s), and the placement a
// GPU bench asks tierd for when tierd's hwloc may not see the GPU.
#pragma once

#include <string>

#include "tier/client.hpp"

namespace tier::bench {

// Dense bf16 TFLOP/s of CUDA device `device` (tensor cores, fp32 accumulation, no sparsity):
// SMs x bf16 FLOP per clock per SM (cc 8.0: 2048, 8.6/8.7/8.9: 1024, 9.0: 4096, 10.x: 8192) x
// the peak clock. 989 on an H100 SXM or H200 (132 SMs, 1.98 GHz), 756 on an H100 PCIe
// (114 SMs, 1.755 GHz), 312 on an A100. 0 when the architecture is not in that list.
double bf16_peak_tflops(int device);

// The best of `reps` timed cublasGemmEx calls, bf16 A, B and C, fp32 compute
// (CUBLAS_COMPUTE_32F), m = n = k = `dim`, in TFLOP/s; < 0 on a CUDA or cuBLAS error (the
// message in *error).
double cublas_bf16_gemm_tflops(int device, int dim, int reps, std::string* error);

// Creates `desc` in `pool` near GPU `device` (its socket's arena); when tierd refuses that
// placement (its hwloc does not see the GPU, as in some guests) the tensor is created with
// Placement::any() and `who` warns about it on stderr, as tier-train does.
Result<TensorInfo> create_near_gpu(Client& c, const std::string& pool, TensorDesc desc, int device,
                                   const char* who);

}  // namespace tier::bench
