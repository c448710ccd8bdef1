#include "trainer/cpu/gemm_library.hpp"

#include <dlfcn.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "trainer/cpu/blas_kernels.hpp"

namespace tier::train {
namespace {

// oneDNN's C API, declared here (libdnnl2 ships no header without its -dev package):
// dnnl_status_t dnnl_sgemm(char transa, char transb, dnnl_dim_t M, N, K, float alpha,
//                          const float* A, dnnl_dim_t lda, const float* B, dnnl_dim_t ldb,
//                          float beta, float* C, dnnl_dim_t ldc);   row-major, 0 = success
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                          int64_t, float, float*, int64_t);
struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
using DnnlVersionFn = const DnnlVersion* (*)();

struct Choice {
  GemmLibrary library = GemmLibrary::kOpenBlas;
  DnnlSgemm dnnl = nullptr;
  std::string name;
  std::string error;
};

Choice choose() {
  Choice c;
  const char* env = std::getenv("TIER_CPU_GEMM");
  const std::string_view want = env != nullptr ? env : "";
  c.name = std::string("OpenBLAS ") + blas_kernels() + " kernels";
  if (want == "openblas") return c;
  if (!want.empty() && want != "onednn") {
    c.error = "TIER_CPU_GEMM=" + std::string(want) + " is neither openblas nor onednn; using " + c.name;
    return c;
  }
  void* lib = ::dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  auto* sgemm = lib != nullptr ? reinterpret_cast<DnnlSgemm>(::dlsym(lib, "dnnl_sgemm")) : nullptr;
  if (sgemm == nullptr) {
    if (want == "onednn")
      c.error = std::string("TIER_CPU_GEMM=onednn but libdnnl.so.2 (Debian's libdnnl2) does not load: ") +
                (lib == nullptr ? ::dlerror() : "no dnnl_sgemm in it") + "; using " + c.name;
    return c;
  }
  auto* version = reinterpret_cast<DnnlVersionFn>(::dlsym(lib, "dnnl_version"));
  const DnnlVersion* v = version != nullptr ? version() : nullptr;
  c.library = GemmLibrary::kOneDnn;
  c.dnnl = sgemm;
  c.name = v != nullptr ? "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                              std::to_string(v->patch) + " GEMMs"
                        : "oneDNN GEMMs";
  return c;  // the library stays loaded for the life of the process
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

// Outside a parallel region oneDNN would thread a product over omp_get_max_threads(); inside one
// (sgemm_split's parts) it runs on the calling thread. This holds the calling thread's OpenMP
// thread count at 1 for one call either way, so every part is one thread's, as with OpenBLAS.
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

}  // namespace

GemmLibrary gemm_library() { return choice().library; }
const char* gemm_library_name() { return choice().name.c_str(); }
const char* gemm_library_error() { return choice().error.c_str(); }

void sgemm_one_thread(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
                      const float* B, int ldb, float beta, float* C, int ldc) {
  const Choice& c = choice();
  if (c.dnnl != nullptr) {
    OneThread one;
    const int st = c.dnnl(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', M, N, K, 1.0f, A, lda,
                          B, ldb, beta, C, ldc);
    if (st == 0) return;
    // dnnl_sgemm refuses only arguments cblas_sgemm would refuse too: let OpenBLAS report them.
  }
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace tier::train
