// The library behind each thread's part of the CPU backend's GEMMs (sgemm_split).
//
// oneDNN's dnnl_sgemm (Debian's libdnnl2, loaded with dlopen when present) runs tier-train's
// products single-threaded at about 1.2x OpenBLAS's rate on this project's shapes and level with
// PyTorch 2.11's own GEMMs (tools/bench-gemm-libs --threads 1, docs/benchmarks.md); OpenBLAS,
// which tier-train links, is the fallback. The choice is made once per process: results are
// bit-identical run to run at the same thread count and library, not across libraries.
// TIER_CPU_GEMM=openblas keeps OpenBLAS; TIER_CPU_GEMM=onednn insists on oneDNN (an error when
// it cannot be loaded, reported by gemm_library_error()).
//
// Thread-safety: the first call of any function below makes the choice (a function-local static);
// every later call from any thread reads it.
#pragma once

#include <cblas.h>

namespace tier::train {

enum class GemmLibrary { kOpenBlas, kOneDnn };

[[nodiscard]] GemmLibrary gemm_library();
// "oneDNN 2.6.3 GEMMs" or "OpenBLAS SkylakeX kernels", for the trainer's banner and --profile.
[[nodiscard]] const char* gemm_library_name();
// Empty, or why the library TIER_CPU_GEMM asked for (or an unknown value of it) is not in use.
[[nodiscard]] const char* gemm_library_error();

// C[M,N] = op(A) op(B) + beta C, row-major (cblas_sgemm's arguments with alpha 1), on the calling
// thread alone, in the chosen library.
void sgemm_one_thread(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
                      const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace tier::train
