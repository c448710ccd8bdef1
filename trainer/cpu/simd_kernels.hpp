// The CPU backend's hand-vectorized kernels (simd_kernels.cpp): GELU, LayerNorm and the row-wise
// kernels here, the flash attention declared in attention.hpp. Each is compiled for AVX-512,
// AVX2 and generic x86-64 (only generic elsewhere) and runs the widest set the CPU and OS
// support, picked once per process: the build needs no -march flag. OpenMP parallel inside;
// call from one thread.
#pragma once

#include <cstdint>

namespace tier::train {

// out[i] = gelu(inp[i]) for i in [0, n), tanh approximation; out may alias inp.
void gelu_forward_simd(float* out, const float* inp, long n);
// dinp[i] = gelu'(inp[i]) * dout[i] (overwrites; dinp may alias dout).
void gelu_backward_simd(float* dinp, const float* inp, const float* dout, long n);

// LayerNorm over rows of C: out[N,C] = (inp - mean) * rstd * w[C] + b[C]; saves mean[N],
// rstd[N] (rstd = 1 / sqrt(var + eps), var the biased variance).
void layernorm_forward_simd(float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, long N, int C, float eps);
// Its backward: dinp[N,C] (= or += per `accumulate`; dinp may alias dout), dw[C] +=, db[C] +=.
void layernorm_backward_simd(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                             const float* w, const float* mean, const float* rstd, long N, int C,
                             bool accumulate);
// db[OC] += the column sums of dout[N,OC].
void bias_grad_simd(float* db, const float* dout, long N, int OC);
// dwte[tokens[r], :] += dout[r, :] and dwpe[r % T, :] += dout[r, :] for the B*T rows of dout[B*T,C].
void embed_grad_simd(float* dwte, float* dwpe, const int32_t* tokens, const float* dout, int B, int T, int C);
// The summed cross-entropy of the rows of logits[N,V] against targets[N]; with grad, each row
// of logits becomes loss_scale * (softmax(row) - onehot(target)).
double softmax_xent_simd(float* logits, const int32_t* targets, long N, int V, bool grad, float loss_scale);

// Sums over rows (dw, db) are per-thread partials over a static split added in thread order:
// the same bits from run to run at one thread count.

// The instruction set the kernels run: "avx512", "avx2" or "generic".
const char* simd_isa();

}  // namespace tier::train
