// The hand-vectorized CPU kernels, each compiled once per instruction set (simd_kernels.hpp).
// simd.inc, flash_attention.inc and gelu.inc are included three times, in the namespaces
// isa_avx512, isa_avx2 and isa_generic, each under its `#pragma GCC target`; the public
// functions below dispatch on simd_isa().
//
// Flash attention (contracts in attention.hpp). Per sequence b and head h (HS = C / NH,
// scale = 1/sqrt(HS)), the head's q, k, v (and k^T, v^T) are first copied into contiguous
// zero-padded buffers (HS rounded up to 32 columns, T to the 64-row tile), so every product
// below is a 64-row tile GEMM on contiguous memory (gemm_tile: register-blocked, no BLAS call).
//
// Forward, per tile of 64 queries, over the key tiles up to the diagonal (the causal mask cuts
// the rest; the diagonal tile masks its upper triangle to -inf): S = q k^T (q pre-scaled), and
// per row the running maximum m, sum l and unnormalized output o (the FlashAttention recurrence)
//   m' = max(m, max S),  l' = l e^(m - m') + sum e^(S - m'),  o' = o e^(m - m') + e^(S - m') v
// and at the end out = o / l, lse = m + log l. Nothing of size T x T is stored.
//
// Backward (FlashAttention-2's), per key tile over the query tiles from the diagonal on, with
// P = exp(scale q k^T - lse) recomputed, dP = dout v^T and D = rowsum(dout * out):
//   dS = P (dP - D),  dv += P^T dout,  dk += scale dS^T q,  dq += scale dS k
// A key tile's dk and dv accumulate in a 64-row tile; dq in a per-head buffer.
//
// Threads: both passes split (b, h) over OpenMP threads; a thread owns its head's columns of out,
// lse, drow and dqkv (no two threads write one element, no atomics).
#include "trainer/cpu/simd_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "trainer/cpu/attention.hpp"

namespace tier::train {

#if defined(__x86_64__)
// GCC's pragmas; clang (tools/lint's clang-tidy) spells the same with `attribute push`.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")
#endif
namespace isa_avx512 {
#define TT_MK_ROWS 8
#include "trainer/cpu/simd.inc"
#include "trainer/cpu/flash_attention.inc"
#include "trainer/cpu/gelu.inc"
#include "trainer/cpu/rows.inc"
#undef TT_MK_ROWS
}  // namespace isa_avx512
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace isa_avx2 {
#define TT_MK_ROWS 4
#include "trainer/cpu/simd.inc"
#include "trainer/cpu/flash_attention.inc"
#include "trainer/cpu/gelu.inc"
#include "trainer/cpu/rows.inc"
#undef TT_MK_ROWS
}  // namespace isa_avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace isa_generic {
#define TT_MK_ROWS 4
#include "trainer/cpu/simd.inc"
#include "trainer/cpu/flash_attention.inc"
#include "trainer/cpu/gelu.inc"
#include "trainer/cpu/rows.inc"
#undef TT_MK_ROWS
}  // namespace isa_generic

namespace {

enum class Isa { kGeneric, kAvx2, kAvx512 };

// __builtin_cpu_supports also checks that the OS saves the registers' state.
Isa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kGeneric;
}

Isa isa() {
  static const Isa i = detect();
  return i;
}

}  // namespace

#if defined(__x86_64__)
#define TT_DISPATCH(fn, ...)                               \
  switch (isa()) {                                         \
    case Isa::kAvx512: return isa_avx512::fn(__VA_ARGS__); \
    case Isa::kAvx2: return isa_avx2::fn(__VA_ARGS__);     \
    case Isa::kGeneric: break;                             \
  }                                                        \
  return isa_generic::fn(__VA_ARGS__)
#else
#define TT_DISPATCH(fn, ...) return isa_generic::fn(__VA_ARGS__)
#endif

const char* simd_isa() {
  switch (isa()) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kGeneric: break;
  }
  return "generic";
}

void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  TT_DISPATCH(flash_forward, out, lse, qkv, B, T, C, NH);
}

void attention_backward_flash(float* dqkv, float* drow, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
  TT_DISPATCH(flash_backward, dqkv, drow, dout, qkv, out, lse, B, T, C, NH);
}

void gelu_forward_simd(float* out, const float* inp, long n) { TT_DISPATCH(gelu_fwd, out, inp, n); }

void gelu_backward_simd(float* dinp, const float* inp, const float* dout, long n) {
  TT_DISPATCH(gelu_bwd, dinp, inp, dout, n);
}

void layernorm_forward_simd(float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, long N, int C, float eps) {
  TT_DISPATCH(ln_fwd, out, mean, rstd, inp, w, b, N, C, eps);
}

void layernorm_backward_simd(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                             const float* w, const float* mean, const float* rstd, long N, int C,
                             bool accumulate) {
  TT_DISPATCH(ln_bwd, dinp, dw, db, dout, inp, w, mean, rstd, N, C, accumulate);
}

void bias_grad_simd(float* db, const float* dout, long N, int OC) { TT_DISPATCH(bias_grad, db, dout, N, OC); }

void embed_grad_simd(float* dwte, float* dwpe, const int32_t* tokens, const float* dout, int B, int T,
                     int C) {
  TT_DISPATCH(embed_grad, dwte, dwpe, tokens, dout, B, T, C);
}

double softmax_xent_simd(float* logits, const int32_t* targets, long N, int V, bool grad, float loss_scale) {
  TT_DISPATCH(softmax_xent, logits, targets, N, V, grad, loss_scale);
}

}  // namespace tier::train
