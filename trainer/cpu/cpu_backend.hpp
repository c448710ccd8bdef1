// The CPU backend: fp32, OpenBLAS GEMMs, OpenMP loops over rows and heads. Device memory is
// host memory (host_accessible() is true). Not thread-safe: one caller thread at a time; the
// methods themselves use the OpenMP thread pool of the calling process.
#pragma once

#include <cblas.h>

#include <memory>

#include "trainer/backend.hpp"

namespace tier::train {

std::unique_ptr<Backend> make_cpu_backend();

// Sets this process's OpenMP thread count to n (>= 1) and OpenBLAS's to 1: the backend's
// GEMMs run single-threaded on each of the n OpenMP threads (sgemm_split), in the library
// gemm_library.hpp chooses.
void set_cpu_threads(int n);

// C[M,N] = alpha op(A) op(B) + beta C (alpha 1, row-major, cblas_sgemm's arguments), split over
// the OpenMP threads by rows of C (M >= N) or columns, in parts that are multiples of 16;
// each part one single-threaded product (sgemm_one_thread: oneDNN or OpenBLAS). Every element
// of C is computed by one thread: the same bits at the same thread count and library. Small products run on
// the calling thread. With `bias` (N floats, beta ignored): C = op(A) op(B) + bias on every row, each thread
// writing its part's bias before its product.
void sgemm_split(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc, const float* bias = nullptr);

// --profile: where the CPU backend's time goes, by kernel category, summed over every call
// since set_cpu_profile(true) (training and validation passes alike). Off by default; off,
// each kernel pays one untaken branch. The caller thread's wall time around each kernel (the
// kernels are OpenMP/OpenBLAS parallel inside), so the categories add up to the backend's time.
struct CpuProfile {
  double gemm_s = 0;       // sgemm_split calls (forward and both backward products)
  double attention_s = 0;  // attention forward and backward
  double layernorm_s = 0;  // LayerNorm forward and backward
  double gelu_s = 0;       // GELU forward and backward
  double other_s = 0;      // embedding, bias adds and sums, residual adds, softmax + loss
  double gemm_flops = 0;   // 2*M*N*K over the sgemm calls
  long gemm_calls = 0;
};
void set_cpu_profile(bool on);
CpuProfile cpu_profile();

// The rate of sgemm_split on C[M,N] = A[M,K] @ B[N,K]^T (the shape of matmul_forward) with the
// current thread count: the best of `reps` timed calls after one untimed, in GFLOP/s.
double sgemm_gflops(int M, int N, int K, int reps);

}  // namespace tier::train
