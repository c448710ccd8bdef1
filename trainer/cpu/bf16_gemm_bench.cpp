// tier-bench-bf16-gemm: the two ways the CPU backend could feed bf16 weights to a GEMM, timed
// on the trainer's GEMM shapes (docs/benchmarks.md, "bf16 GEMMs"):
//   widen: bf16 -> fp32 conversion of the operands that are bf16 (the weights), then
//          cblas_sgemm (what --precision bf16 runs: the fp32 activations stay exact);
//   sbgemm: fp32 -> bf16 conversion of the fp32 operands (activations, gradients), then
//          OpenBLAS's cblas_sbgemm (bf16 inputs, fp32 accumulation and output).
// Each of a block's four linear layers (qkv [3C,C], proj [C,C], fc [4C,C], fcproj [C,4C]) and
// the tied head [V,C], in its three products (forward, input gradient, weight gradient), for M
// = B*T tokens. The two ways alternate, best of --reps; a step's share is L blocks and the head.
// Also timed: the fp32 GEMMs alone, so the conversions' share shows. cblas_sbgemm is looked up
// at run time: an OpenBLAS built without BUILD_BFLOAT16 (Debian 12's 0.3.21) declares it in
// cblas.h but does not export it, and the sbgemm column then says so.
// Usage: tier-bench-bf16-gemm [--dim C] [--layers L] [--vocab V] [--tokens M] [--reps N]
//        [--threads N]
#include <cblas.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "trainer/bf16.hpp"
#include "trainer/cpu/blas_kernels.hpp"
#include "trainer/cpu/cpu_backend.hpp"

using namespace tier::train;

namespace {

// Runs f once; keeps the shortest time in `best` (seconds).
void time_into(const std::function<void()>& f, double& best) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

struct Shape {
  const char* name;
  int N, K;   // weight [N,K]
  int count;  // uses per step: L for a block's layers, 1 for the head
};

using Sbgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                        const bf16_t*, blasint, const bf16_t*, blasint, float, float*, blasint);

struct Times {
  double sgemm = 1e30, widen = 1e30, sbgemm = 1e30;  // seconds, best of the repetitions
};

// The three products of out[M,N] = inp[M,K] @ W[N,K]^T: fp32 alone, widened, and with sbgemm
// (when `sbgemm` is not null).
Times time_shape(const Shape& s, int M, int reps, Sbgemm sbgemm) {
  const size_t MK = static_cast<size_t>(M) * s.K, NK = static_cast<size_t>(s.N) * s.K,
               MN = static_cast<size_t>(M) * s.N;
  std::vector<float> x(MK), dy(MN), out(MN), dx(MK), dw(NK), wf(NK);
  std::vector<bf16_t> wb(NK), xb(MK), dyb(MN);
  for (size_t i = 0; i < MK; ++i) x[i] = static_cast<float>(i % 97) * 0.01f - 0.48f;
  for (size_t i = 0; i < MN; ++i) dy[i] = static_cast<float>(i % 89) * 0.001f - 0.044f;
  for (size_t i = 0; i < NK; ++i) wb[i] = bf16_from_f32(static_cast<float>(i % 83) * 0.001f - 0.04f);
  const int N = s.N, K = s.K;
  auto plain = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, wf.data(), K, 0.0f,
                out.data(), N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy.data(), N, wf.data(), K, 0.0f,
                dx.data(), K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy.data(), N, x.data(), K, 1.0f,
                dw.data(), K);
  };
  auto widen = [&] {
    bf16_to_f32(wb.data(), wf.data(), NK);  // forward use
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, wf.data(), K, 0.0f,
                out.data(), N);
    bf16_to_f32(wb.data(), wf.data(), NK);  // backward use (gathered again)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy.data(), N, wf.data(), K, 0.0f,
                dx.data(), K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy.data(), N, x.data(), K, 1.0f,
                dw.data(), K);
  };
  auto sb = [&] {
    f32_to_bf16(x.data(), xb.data(), MK);
    sbgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, xb.data(), K, wb.data(), K, 0.0f,
           out.data(), N);
    f32_to_bf16(dy.data(), dyb.data(), MN);
    sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dyb.data(), N, wb.data(), K, 0.0f,
           dx.data(), K);
    sbgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dyb.data(), N, xb.data(), K, 1.0f,
           dw.data(), K);
  };
  Times t;
  widen();  // warm caches and threads
  if (sbgemm != nullptr) sb();
  for (int r = 0; r < reps; ++r) {
    time_into(plain, t.sgemm);
    time_into(widen, t.widen);
    if (sbgemm != nullptr) time_into(sb, t.sbgemm);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  // As tier-train (trainer/main.cpp): OpenMP threads wait passively, or the conversions' spinning
  // threads hold the cores the next GEMM wants (read when libgomp loads: set, then re-execute).
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && ::setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
    ::execv("/proc/self/exe", argv);
  int C = 768, L = 12, V = 256, M = 4 * 1024, reps = 5, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--dim") C = v;
    else if (a == "--layers") L = v;
    else if (a == "--vocab") V = v;
    else if (a == "--tokens") M = v;
    else if (a == "--reps") reps = v;
    else if (a == "--threads") threads = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads > 0) set_cpu_threads(threads);
  // OpenBLAS's own threads for both sides (the trainer's backend splits over OpenMP instead).
  if (threads > 0) openblas_set_num_threads(threads);
  const Shape shapes[] = {{"qkv", 3 * C, C, L},
                          {"proj", C, C, L},
                          {"fc", 4 * C, C, L},
                          {"fcproj", C, 4 * C, L},
                          {"head", V, C, 1}};
  std::printf("OpenBLAS %s kernels, C=%d L=%d V=%d M=%d tokens, best of %d (fwd + both bwd products)\n",
              blas_kernels(), C, L, V, M, reps);
  const auto sbgemm = reinterpret_cast<Sbgemm>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  if (sbgemm == nullptr)
    std::printf("cblas_sbgemm: not in this OpenBLAS (built without BUILD_BFLOAT16); widen+sgemm only\n");
  Times total{0, 0, 0};
  for (const Shape& s : shapes) {
    const Times t = time_shape(s, M, reps, sbgemm);
    const double flops = 3 * 2.0 * M * s.N * s.K;
    std::printf("%-7s [%5d x %5d]  sgemm alone %8.3f ms (%6.1f GFLOP/s)  widen+sgemm %8.3f ms (x%.3f)",
                s.name, s.N, s.K, t.sgemm * 1e3, flops / t.sgemm / 1e9, t.widen * 1e3, t.widen / t.sgemm);
    if (sbgemm != nullptr)
      std::printf("  sbgemm %8.3f ms (%6.1f GFLOP/s, x%.3f of widen)", t.sbgemm * 1e3, flops / t.sbgemm / 1e9,
                  t.sbgemm / t.widen);
    std::printf("\n");
    total.sgemm += t.sgemm * s.count;
    total.widen += t.widen * s.count;
    total.sbgemm += t.sbgemm * s.count;
  }
  std::printf("step's GEMMs: sgemm alone %.1f ms, widen+sgemm %.1f ms (x%.3f)", total.sgemm * 1e3,
              total.widen * 1e3, total.widen / total.sgemm);
  if (sbgemm != nullptr)
    std::printf(", sbgemm %.1f ms (x%.3f of widen)", total.sbgemm * 1e3, total.sbgemm / total.widen);
  std::printf("\n");
  return 0;
}
