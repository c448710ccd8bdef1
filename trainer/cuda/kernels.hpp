// CUDA kernels of the tier-train CUDA backend, as plain C++20 launchers (no tier::Status, no
// <expected>): the .cu side is compiled by nvcc with -std=c++20, the backend that calls these is
// host C++23. Every launcher enqueues on `stream` and returns the launch error (cudaSuccess when
// enqueued); none synchronizes. Pointers are device memory; sizes are element counts.
//
// Layouts follow trainer/backend.hpp: row-major, N = B*T rows of width C, linear weights
// [out, in]. "acc" in a name or comment means the kernel adds into its output (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tier::train::cuda {

// ---- embedding ----
// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
cudaError_t encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                            int T, int C, cudaStream_t stream);
// dwte[tokens[b,t],:] += dout[b,t,:] (atomic); dwpe[t,:] += sum_b dout[b,t,:]
cudaError_t encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                             int C, cudaStream_t stream);

// ---- LayerNorm over the last dim (eps 1e-5) ----
cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                              const float* b, int N, int C, cudaStream_t stream);
// dinp += d/dinp (accumulates, so the residual gradient can be pre-loaded);
// dw += sum_n dout*xhat; db += sum_n dout.
cudaError_t layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                               const float* w, const float* mean, const float* rstd, int N, int C,
                               cudaStream_t stream);

// ---- elementwise ----
// GELU, tanh approximation.
cudaError_t gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
// dinp = gelu'(inp) * dout (overwrites; dinp may alias dout).
cudaError_t gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, cudaStream_t stream);
// out[i] = a[i] + b[i] (out may alias a or b).
cudaError_t add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
// out[n, oc] += bias[oc] for N rows of OC.
cudaError_t add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream);
// dst[oc] += sum_n src[n, oc] (bias gradients).
cudaError_t column_sum_acc(float* dst, const float* src, int N, int OC, cudaStream_t stream);
// p[i] *= s.
cudaError_t scale(float* p, float s, size_t n, cudaStream_t stream);

// ---- reference attention (unfused: cuBLAS batched GEMMs do QK^T and AV, these do the rest) ----
// qkv[B,T,3C] → q,k,v each [B,NH,T,HS] (HS = C/NH).
cudaError_t attention_split_heads(float* q, float* k, float* v, const float* qkv, int B, int T, int C, int NH,
                                  cudaStream_t stream);
// Inverse of split: dq,dk,dv [B,NH,T,HS] → dqkv[B,T,3C] (overwrites).
cudaError_t attention_merge_heads_qkv(float* dqkv, const float* dq, const float* dk, const float* dv, int B,
                                      int T, int C, int NH, cudaStream_t stream);
// y[B,NH,T,HS] → out[B,T,C]
cudaError_t attention_merge_heads(float* out, const float* y, int B, int T, int C, int NH,
                                  cudaStream_t stream);
// inp[B,T,C] → y[B,NH,T,HS] (backward of merge).
cudaError_t attention_split_out(float* y, const float* inp, int B, int T, int C, int NH, cudaStream_t stream);
// att[r, :] = softmax(scale * preatt[r, 0..t]) over the causal prefix of row r (t = r % T);
// entries past t are written 0. rows = B*NH*T, each of length T. att may alias preatt.
cudaError_t causal_softmax_forward(float* att, const float* preatt, float scale, int rows, int T,
                                   cudaStream_t stream);
// dpreatt = scale * att * (datt - sum_j att*datt) over the causal prefix, 0 elsewhere
// (overwrites; may alias datt).
cudaError_t causal_softmax_backward(float* dpreatt, const float* att, const float* datt, float scale,
                                    int rows, int T, cudaStream_t stream);

// ---- flash attention (flash_attention.cu): tiled, online softmax, memory linear in T ----
// Causal attention of qkv[B,T,3C] (q | k | v, head h at columns h*HS of each, HS = C/NH <= 256,
// scale 1/sqrt(HS)): out[B,T,C] (overwritten) and lse[B,NH,T] = log of each row's softmax
// denominator of the scaled scores. No [T,T] buffer. cudaErrorInvalidValue, before any launch,
// when HS > 256 or B * NH > 65535.
cudaError_t flash_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                                    cudaStream_t stream);
// dqkv[B,T,3C] (overwritten) from dout[B,T,C], given the forward's qkv, out and lse; drow[B,NH,T]
// is scratch (it receives rowsum(dout * out) per head). Deterministic (no atomics).
cudaError_t flash_attention_backward(float* dqkv, float* drow, const float* dout, const float* qkv,
                                     const float* out, const float* lse, int B, int T, int C, int NH,
                                     cudaStream_t stream);

// drow[B,NH,T] = rowsum(dout * out) over each head's HS columns (D of the flash backward).
cudaError_t flash_attention_rowdot(float* drow, const float* dout, const float* out, int B, int T, int C,
                                   int NH, cudaStream_t stream);

// ---- flash attention on the tensor cores (flash_attention_tc.cu) ----
// The same contracts as flash_attention_forward / _backward, computed with bf16 operands on
// the tensor cores and fp32 accumulation (q, k, v, P, dS and dout rounded to bf16 inside each
// tile; softmax statistics, lse and D in fp32): agrees with the fp32 kernels to bf16 accuracy
// (about 1e-2 of the largest value), not to the ulp. Head sizes 32, 64 and 128 only
// (flash_attention_tc_supported); cudaErrorInvalidValue otherwise, before any launch. Needs
// sm_80 or newer.
bool flash_attention_tc_supported(int B, int T, int C, int NH);
cudaError_t flash_attention_forward_tc(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                                       cudaStream_t stream);
cudaError_t flash_attention_backward_tc(float* dqkv, float* drow, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int B, int T, int C, int NH,
                                        cudaStream_t stream);

// ---- loss ----
// For each of N rows of V logits: losses[n] = logsumexp(logits[n]) - logits[n, targets[n]].
// When `dlogits_scale` != 0, overwrites logits[n] with dlogits_scale * (softmax - onehot).
cudaError_t cross_entropy(float* losses, float* logits, const int32_t* targets, int N, int V,
                          float dlogits_scale, cudaStream_t stream);
// *out = sum of n floats, in double (single block; n up to a few million).
cudaError_t sum_to_double(double* out, const float* in, size_t n, cudaStream_t stream);

// ---- optimizer and precision ----
struct AdamW {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
  int step = 1;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // grads are multiplied by this first (e.g. 1/ranks)
};
// Fused AdamW on fp32 master weights p with moments m, v: one pass reads g, p, m, v and writes
// p, m, v and, when `bf16_out` is not null, the updated weight rounded to bf16 (working copy).
cudaError_t adamw(float* p, const float* g, float* m, float* v, uint16_t* bf16_out, size_t n, const AdamW& h,
                  cudaStream_t stream);
// bf16 values are uint16_t bits (trainer/bf16.hpp). fp32 -> bf16 rounds to nearest even and
// gives the same bits as the host's bf16_from_f32 for every input (NaN and denormals included);
// bf16 -> fp32 is exact. So a shard converted on the device or on the host is the same shard.
cudaError_t f32_to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t stream);
cudaError_t bf16_to_f32(float* out, const uint16_t* in, size_t n, cudaStream_t stream);

}  // namespace tier::train::cuda
