// CPU kernels of tier-train. Shapes are written beside each buffer; rows are B*T positions.
#include "trainer/cpu/cpu_backend.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "trainer/cpu/attention.hpp"
#include "trainer/cpu/gemm_library.hpp"
#include "trainer/cpu/simd_kernels.hpp"

namespace tier::train {
namespace {

// --profile (cpu_backend.hpp). The backend is called from one thread, so plain globals do.
bool g_profile = false;
CpuProfile g_prof;

// Adds the wall time of its scope to *acc when profiling is on.
class Timed {
 public:
  explicit Timed(double CpuProfile::* field)
      : field_(g_profile ? field : nullptr),
        t0_(g_profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  ~Timed() {
    if (field_ != nullptr)
      g_prof.*field_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double CpuProfile::* field_;
  std::chrono::steady_clock::time_point t0_;
};

// sgemm_split, timed and counted under --profile.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc, const float* bias = nullptr) {
  Timed timed(&CpuProfile::gemm_s);
  if (g_profile) {
    g_prof.gemm_flops += 2.0 * M * N * K;
    ++g_prof.gemm_calls;
  }
  sgemm_split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
}

constexpr float kLnEps = 1e-5f;

// out[N,C] = LayerNorm(inp[N,C]) * w[C] + b[C]; saves mean[N], rstd[N].
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       long N, int C) {
  Timed timed(&CpuProfile::layernorm_s);
  layernorm_forward_simd(out, mean, rstd, inp, w, b, N, C, kLnEps);
}

// dinp[N,C] (= or += per `accumulate`), dw[C] +=, db[C] +=. dinp may alias dout.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, long N, int C,
                        bool accumulate) {
  Timed timed(&CpuProfile::layernorm_s);
  layernorm_backward_simd(dinp, dw, db, dout, inp, w, mean, rstd, N, C, accumulate);
}

// out[N,OC] = inp[N,IC] @ W[OC,IC]^T + b[OC] (b may be null).
void matmul_forward(float* out, const float* inp, const float* W, const float* b, long N, int IC, int OC) {
  // The bias goes in with the product (each thread's part of out starts as its rows of b).
  sgemm(CblasNoTrans, CblasTrans, static_cast<int>(N), OC, IC, inp, IC, W, IC, 0.0f, out, OC, b);
}

// dinp[N,IC] = (or += when beta 1) dout[N,OC] @ W[OC,IC]; dW[OC,IC] += dout^T @ inp;
// db[OC] += column sums of dout (db may be null).
void matmul_backward(float* dinp, float* dW, float* db, const float* dout, const float* inp, const float* W,
                     long N, int IC, int OC, float beta) {
  sgemm(CblasNoTrans, CblasNoTrans, static_cast<int>(N), IC, OC, dout, OC, W, IC, beta, dinp, IC);
  sgemm(CblasTrans, CblasNoTrans, OC, IC, static_cast<int>(N), dout, OC, inp, IC, 1.0f, dW, IC);
  if (db == nullptr) return;
  Timed timed(&CpuProfile::other_s);
  bias_grad_simd(db, dout, N, OC);
}

// GELU, tanh approximation (simd_kernels.hpp), timed under --profile.
void gelu_forward(float* out, const float* inp, long n) {
  Timed timed(&CpuProfile::gelu_s);
  gelu_forward_simd(out, inp, n);
}

// dinp = gelu'(inp) * dout (overwrites; dinp may alias dout).
void gelu_backward(float* dinp, const float* inp, const float* dout, long n) {
  Timed timed(&CpuProfile::gelu_s);
  gelu_backward_simd(dinp, inp, dout, n);
}

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool host_accessible() const override { return true; }
  float* alloc(size_t n) override {
    return static_cast<float*>(std::aligned_alloc(64, round_up(n * sizeof(float))));
  }
  void free(float* p) override { std::free(p); }
  void zero(float* p, size_t n) override { std::memset(p, 0, n * sizeof(float)); }
  void upload(float* dst, const float* src, size_t n) override {
    if (dst != src) std::memcpy(dst, src, n * sizeof(float));
  }
  void download(float* dst, const float* src, size_t n) override {
    if (dst != src) std::memcpy(dst, src, n * sizeof(float));
  }
  int32_t* alloc_tokens(size_t n) override {
    return static_cast<int32_t*>(std::aligned_alloc(64, round_up(n * sizeof(int32_t))));
  }
  void free_tokens(int32_t* p) override { std::free(p); }
  void upload_tokens(int32_t* dst, const int32_t* src, size_t n) override {
    if (dst != src) std::memcpy(dst, src, n * sizeof(int32_t));
  }
  void synchronize() override {}

  // fp32 parameters only (bf16_params() is false): LayerParams::f32.
  void embed_forward(const Dims& d, LayerParams lp, const int32_t* tokens, float* out) override {
    const float* params = lp.f32;
    const EmbedLayout l = embed_layout(d);
    const float* wte = params + l.wte;
    const float* wpe = params + l.wpe;
    const int C = d.C;
    Timed timed(&CpuProfile::other_s);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < d.B; ++b)
      for (int t = 0; t < d.T; ++t) {
        const long row = static_cast<long>(b) * d.T + t;
        const float* e = wte + static_cast<long>(tokens[row]) * C;
        const float* p = wpe + static_cast<long>(t) * C;
        float* o = out + row * C;
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      }
  }

  void embed_backward(const Dims& d, float* grads, const int32_t* tokens, const float* dout) override {
    const EmbedLayout l = embed_layout(d);
    float* dwte = grads + l.wte;
    float* dwpe = grads + l.wpe;
    const int C = d.C;
    Timed timed(&CpuProfile::other_s);
    embed_grad_simd(dwte, dwpe, tokens, dout, d.B, d.T, C);
  }

  void block_forward(const Dims& d, LayerParams params, const float* x, BlockActs a, float* y) override {
    const BlockLayout l = block_layout(d);
    const long N = static_cast<long>(d.B) * d.T;
    const int C = d.C;
    const float* p = params.f32;
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p + l.ln1_w, p + l.ln1_b, N, C);
    matmul_forward(a.qkv, a.ln1, p + l.qkv_w, p + l.qkv_b, N, C, 3 * C);
    {
      Timed timed(&CpuProfile::attention_s);
      if (d.attention == Attention::kReference)
        attention_forward_reference(a.atty, a.att, a.qkv, d.B, d.T, C, d.NH);
      else attention_forward_flash(a.atty, a.lse, a.qkv, d.B, d.T, C, d.NH);
    }
    matmul_forward(a.r, a.atty, p + l.proj_w, p + l.proj_b, N, C, C);
    add_inplace(a.r, x, N * C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.r, p + l.ln2_w, p + l.ln2_b, N, C);
    matmul_forward(a.fch, a.ln2, p + l.fc_w, p + l.fc_b, N, C, 4 * C);
    gelu_forward(a.fch_gelu, a.fch, N * 4 * C);
    matmul_forward(y, a.fch_gelu, p + l.fcproj_w, p + l.fcproj_b, N, 4 * C, C);
    add_inplace(y, a.r, N * C);
  }

  void block_backward(const Dims& d, LayerParams params, float* grads, const float* x, BlockActs a,
                      const float* dy, float* dx, float* scratch) override {
    const BlockLayout l = block_layout(d);
    const long N = static_cast<long>(d.B) * d.T;
    const int C = d.C;
    const float* p = params.f32;
    float* g = grads;
    float* dln = scratch;                            // [N,C]
    float* dqkv = dln + N * C;                       // [N,3C]
    float* datt = dqkv + N * 3 * C;                  // reference: [B,NH,T,T]; flash: drow [B,NH,T]
    float* datty = datt + attention_acts_floats(d);  // [N,C]
    float* dfch = datty + N * C;                     // [N,4C]
    float* dr = dfch + N * 4 * C;                    // [N,C]

    // MLP: y = r + fcproj(gelu(fc(ln2(r)))). dy is fully consumed here (dx may alias it).
    std::memcpy(dr, dy, sizeof(float) * N * C);
    matmul_backward(dfch, g + l.fcproj_w, g + l.fcproj_b, dy, a.fch_gelu, p + l.fcproj_w, N, 4 * C, C, 0.0f);
    gelu_backward(dfch, a.fch, dfch, N * 4 * C);
    matmul_backward(dln, g + l.fc_w, g + l.fc_b, dfch, a.ln2, p + l.fc_w, N, C, 4 * C, 0.0f);
    layernorm_backward(dr, g + l.ln2_w, g + l.ln2_b, dln, a.r, p + l.ln2_w, a.ln2_mean, a.ln2_rstd, N, C,
                       true);
    // Attention: r = x + proj(attention(qkv(ln1(x)))).
    matmul_backward(datty, g + l.proj_w, g + l.proj_b, dr, a.atty, p + l.proj_w, N, C, C, 0.0f);
    {
      Timed timed(&CpuProfile::attention_s);
      if (d.attention == Attention::kReference)
        attention_backward_reference(dqkv, datt, datty, a.qkv, a.att, d.B, d.T, C, d.NH);
      else attention_backward_flash(dqkv, datt, datty, a.qkv, a.atty, a.lse, d.B, d.T, C, d.NH);
    }
    matmul_backward(dln, g + l.qkv_w, g + l.qkv_b, dqkv, a.ln1, p + l.qkv_w, N, C, 3 * C, 0.0f);
    std::memcpy(dx, dr, sizeof(float) * N * C);
    layernorm_backward(dx, g + l.ln1_w, g + l.ln1_b, dln, x, p + l.ln1_w, a.ln1_mean, a.ln1_rstd, N, C, true);
  }

  double head_forward(const Dims& d, LayerParams lp, const float* x, const int32_t* targets, HeadActs a,
                      float* dx, float* grads, float loss_scale) override {
    const float* params = lp.f32;
    const EmbedLayout l = embed_layout(d);
    const long N = static_cast<long>(d.B) * d.T;
    const int C = d.C, V = d.V;
    const float* wte = params + l.wte;
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, params + l.lnf_w, params + l.lnf_b, N, C);
    matmul_forward(a.logits, a.lnf, wte, nullptr, N, C, V);
    const bool grad = dx != nullptr;
    std::optional<Timed> t_loss(std::in_place, &CpuProfile::other_s);
    const double loss = softmax_xent_simd(a.logits, targets, N, V, grad, loss_scale);
    t_loss.reset();
    if (!grad) return loss;
    // dlogits[N,V] in a.logits; logits = lnf @ wte^T.
    matmul_backward(dx, grads + l.wte, nullptr, a.logits, a.lnf, wte, N, C, V, 0.0f);
    layernorm_backward(dx, grads + l.lnf_w, grads + l.lnf_b, dx, x, params + l.lnf_w, a.lnf_mean, a.lnf_rstd,
                       N, C, false);
    return loss;
  }

 private:
  static size_t round_up(size_t bytes) { return (bytes + 63) / 64 * 64 + 64; }
  static void add_inplace(float* dst, const float* src, long n) {
    Timed timed(&CpuProfile::other_s);
#pragma omp parallel for simd
    for (long i = 0; i < n; ++i) dst[i] += src[i];
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

void set_cpu_profile(bool on) {
  g_profile = on;
  g_prof = CpuProfile{};
}

CpuProfile cpu_profile() { return g_prof; }

namespace {

// C[r, c0..c1) = bias[c0..c1) for rows r in [r0, r1).
void fill_bias(float* C, int ldc, const float* bias, int r0, int r1, int c0, int c1) {
  for (int r = r0; r < r1; ++r)
    std::memcpy(C + static_cast<long>(r) * ldc + c0, bias + c0, sizeof(float) * static_cast<size_t>(c1 - c0));
}

}  // namespace

void sgemm_split(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  const int threads = omp_get_max_threads();
  if (bias != nullptr) beta = 1.0f;  // each part starts from its rows of bias
  // Below about 2^18 multiply-adds a second thread costs more than it saves.
  if (threads == 1 || static_cast<double>(M) * N * K < 262144.0) {
    if (bias != nullptr) fill_bias(C, ldc, bias, 0, M, 0, N);
    sgemm_one_thread(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  const int extent = split_rows ? M : N;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Part t of the split dimension, in multiples of 16 (whole vectors of the kernels).
    const auto edge = [&](int i) { return i == nt ? extent : std::min(extent, extent / nt * i / 16 * 16); };
    const int lo = edge(t), hi = edge(t + 1);
    if (hi > lo && split_rows) {  // rows [lo, hi) of C and of op(A)
      if (bias != nullptr) fill_bias(C, ldc, bias, lo, hi, 0, N);
      sgemm_one_thread(ta, tb, hi - lo, N, K, ta == CblasNoTrans ? A + static_cast<long>(lo) * lda : A + lo,
                       lda, B, ldb, beta, C + static_cast<long>(lo) * ldc, ldc);
    } else if (hi > lo) {  // columns [lo, hi) of C and of op(B)
      if (bias != nullptr) fill_bias(C, ldc, bias, 0, M, lo, hi);
      sgemm_one_thread(ta, tb, M, hi - lo, K, A, lda,
                       tb == CblasNoTrans ? B + lo : B + static_cast<long>(lo) * ldb, ldb, beta, C + lo, ldc);
    }
  }
}

double sgemm_gflops(int M, int N, int K, int reps) {
  std::vector<float> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(N) * K),
      c(static_cast<size_t>(M) * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 97) * 0.01f - 0.48f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 89) * 0.01f - 0.44f;
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    sgemm_split(CblasNoTrans, CblasTrans, M, N, K, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);  // the first call is untimed (warms caches and threads)
  }
  return 2.0 * M * N * K / best / 1e9;
}

// The GEMM library runs single-threaded: the backend splits each product over its OpenMP
// threads itself (sgemm_split), so one thread pool holds the cores and no OpenBLAS worker spins
// on a core the next OpenMP kernel needs.
void set_cpu_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(1);
}

}  // namespace tier::train
