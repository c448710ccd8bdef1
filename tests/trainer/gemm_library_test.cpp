// The CPU backend's GEMMs (sgemm_split over sgemm_one_thread) against a double-precision loop,
// in whichever library gemm_library() chose, and that choice against what this machine has.
#include <catch2/catch.hpp>
#include <dlfcn.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/cpu/cpu_backend.hpp"
#include "trainer/cpu/gemm_library.hpp"

using namespace tier::train;

namespace {

struct Case {
  CBLAS_TRANSPOSE ta, tb;
  int M, N, K;
  float beta;
};

// C = op(A) op(B) + beta C in double, row-major with the leading dimensions given.
void reference(const Case& c, const std::vector<float>& A, int lda, const std::vector<float>& B, int ldb,
               std::vector<double>& C, int ldc) {
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double s = 0;
      for (int k = 0; k < c.K; ++k) {
        const double a =
            c.ta == CblasNoTrans ? A[static_cast<size_t>(i) * lda + k] : A[static_cast<size_t>(k) * lda + i];
        const double b =
            c.tb == CblasNoTrans ? B[static_cast<size_t>(k) * ldb + j] : B[static_cast<size_t>(j) * ldb + k];
        s += a * b;
      }
      C[static_cast<size_t>(i) * ldc + j] = s + c.beta * C[static_cast<size_t>(i) * ldc + j];
    }
}

float value(size_t i, int salt) {
  return static_cast<float>((i * 2654435761u + salt) % 1000) / 500.0f - 1.0f;
}

void check(const Case& c, bool split) {
  // Leading dimensions wider than the matrices: the parts must honour them.
  const int lda = (c.ta == CblasNoTrans ? c.K : c.M) + 3, ldb = (c.tb == CblasNoTrans ? c.N : c.K) + 5,
            ldc = c.N + 7;
  std::vector<float> A(static_cast<size_t>(c.ta == CblasNoTrans ? c.M : c.K) * lda),
      B(static_cast<size_t>(c.tb == CblasNoTrans ? c.K : c.N) * ldb), C(static_cast<size_t>(c.M) * ldc);
  for (size_t i = 0; i < A.size(); ++i) A[i] = value(i, 1);
  for (size_t i = 0; i < B.size(); ++i) B[i] = value(i, 2);
  for (size_t i = 0; i < C.size(); ++i) C[i] = value(i, 3);
  std::vector<double> want(C.begin(), C.end());
  reference(c, A, lda, B, ldb, want, ldc);
  if (split) sgemm_split(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  else sgemm_one_thread(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  double worst = 0;
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      const size_t at = static_cast<size_t>(i) * ldc + j;
      worst = std::max(worst, std::abs(C[at] - want[at]));
    }
  // Terms of magnitude <= 1: fp32 accumulation over K terms stays within K * 2^-22 or so.
  INFO("M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << (c.ta == CblasTrans)
            << " tb=" << (c.tb == CblasTrans) << " beta=" << c.beta << " split=" << split << " in "
            << gemm_library_name());
  CHECK(worst <= 1e-6 * c.K + 1e-5);
  // The padding between rows of C is never written.
  for (int i = 0; i < c.M; ++i)
    for (int j = c.N; j < ldc; ++j)
      CHECK(C[static_cast<size_t>(i) * ldc + j] == value(static_cast<size_t>(i) * ldc + j, 3));
}

}  // namespace

TEST_CASE("CPU GEMMs: every transpose, beta and odd shape against a double loop", "[trainer][gemm]") {
  const Case cases[] = {
      {CblasNoTrans, CblasTrans, 96, 160, 64, 0.0f},    // forward: inp @ W^T
      {CblasNoTrans, CblasNoTrans, 96, 64, 160, 0.0f},  // dinp = dout @ W
      {CblasTrans, CblasNoTrans, 160, 64, 96, 1.0f},    // dW += dout^T @ inp
      {CblasTrans, CblasTrans, 33, 17, 29, 0.5f},       // odd sizes, both transposed
      {CblasNoTrans, CblasTrans, 1, 1, 1, 1.0f},
  };
  for (const Case& c : cases) {
    check(c, false);
    check(c, true);
  }
  omp_set_num_threads(2);  // the split's parts on two threads (rows, then columns)
  check({CblasNoTrans, CblasTrans, 256, 96, 128, 0.0f}, true);
  check({CblasNoTrans, CblasNoTrans, 48, 320, 128, 1.0f}, true);
}

TEST_CASE("CPU GEMMs: oneDNN where libdnnl.so.2 loads, OpenBLAS otherwise or when asked", "[trainer][gemm]") {
  const char* env = std::getenv("TIER_CPU_GEMM");
  const std::string name = gemm_library_name();
  void* dnnl = ::dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  INFO("chose " << name << "; TIER_CPU_GEMM=" << (env ? env : "(unset)"));
  if (env != nullptr && std::string(env) == "openblas") {
    CHECK(gemm_library() == GemmLibrary::kOpenBlas);
  } else if (dnnl != nullptr) {
    CHECK(gemm_library() == GemmLibrary::kOneDnn);
    CHECK(name.rfind("oneDNN", 0) == 0);
    CHECK(std::string(gemm_library_error()).empty());
  } else {
    CHECK(gemm_library() == GemmLibrary::kOpenBlas);
    CHECK(name.rfind("OpenBLAS", 0) == 0);
  }
  if (dnnl != nullptr) ::dlclose(dnnl);
}
