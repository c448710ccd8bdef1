// The CUDA backend of tier-train: tier::train::Backend on one GPU (kernels.cu + cuBLAS).
//
// The trainer selects it with `--backend cuda` (only in builds with TIER_HAVE_CUDA):
//
//   #ifdef TIER_HAVE_CUDA
//   #include "trainer/cuda/cuda_backend.hpp"
//   std::string err;
//   auto be = tier::train::cuda::make_cuda_backend({.device = local_rank}, &err);
//   if (!be) { /* err says why: "no CUDA device: ..." on a machine without a GPU */ }
//   #endif
//
// Plain C++20 (no tier::Status) so that it can be included from .cu files too.
//
// Precision: activations, gradients and the saved state are fp32 buffers. GEMMs run on bf16
// tensor cores with fp32 accumulation: with fp32 parameters through cuBLAS
// CUBLAS_COMPUTE_32F_FAST_16BF (operands rounded to bf16 inside the GEMM); with bf16
// parameters (LayerParams::bf16, bf16_params() is true: the pipeline's gathered bf16 layers) a
// block's four weight matrices are read as they are, the activation operand is rounded to bf16
// (the same rounding) and the GEMM is bf16 x bf16 -> fp32 with CUBLAS_COMPUTE_32F; LayerNorm
// scales, biases and layer 0 are widened to fp32 (small). LayerNorm statistics, softmax, the
// loss and every gradient accumulation stay fp32. `exact_gemm` switches to plain fp32 GEMMs
// (bf16 parameters are then widened whole).
//
// Errors: the Backend methods return nothing, so the first CUDA/cuBLAS error is kept (sticky)
// and later calls do nothing; head_forward then returns NaN and error() says what failed.
// Memory handed out by alloc() must be released with free() before the backend is destroyed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "trainer/backend.hpp"

namespace tier::train::cuda {

struct CudaBackendOptions {
  int device = 0;           // CUDA device index (a rank usually passes its local rank)
  bool exact_gemm = false;  // fp32 GEMMs instead of bf16 tensor cores
};

// nullptr and a message in *error when no device can be used (message starts "no CUDA device"
// on machines without a GPU or driver).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opts, std::string* error);

// The sticky error of a backend made by make_cuda_backend ("" when none); "" for other backends.
std::string backend_error(const Backend& b);

// The compute stream of a CUDA backend (a cudaStream_t), for ordering copies and collectives
// against its kernels; nullptr for other backends.
void* backend_stream(const Backend& b);

}  // namespace tier::train::cuda

namespace tier::train {
// What tier-train's main() calls for `--backend cuda` (declared there under
// TIER_TRAIN_HAVE_CUDA): the backend on the device trainer/gpu_map.hpp picks for local_rank
// by PCI address (cuda_device_for_rank; CUDA_VISIBLE_DEVICES honoured), fp32-storage with bf16
// tensor-core GEMMs. `pci` (optional) receives that device's PCI bus id, which the tier state
// matches against tierd's GPUs. Returns nullptr when no device can be used, after printing the
// reason to stderr as one "tier-train: --backend cuda: ..." line (the caller has no other way
// to show it).
std::unique_ptr<Backend> make_cuda_backend(int local_rank, std::string* pci = nullptr);

// Page-locks host memory the trainer allocated itself (its gather slots and gradient buffers)
// so Backend::upload / download DMA it directly instead of going through CUDA's pageable
// staging. Undo with cuda_unpin_host before the memory is freed (a freed range that stays
// registered would be DMA'd from stale pages). false, with the reason, when refused.
bool cuda_pin_host(void* p, size_t bytes, std::string* error);
void cuda_unpin_host(void* p);
}  // namespace tier::train
