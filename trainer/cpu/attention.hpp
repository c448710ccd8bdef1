// Causal multi-head self-attention of the CPU backend, forward and backward, in two forms:
//
//   reference  (attention_reference.cpp)  materializes the probabilities att[B,NH,T,T] in the
//              forward and a datt[B,NH,T,T] scratch in the backward: memory quadratic in T.
//   flash      (flash_attention.inc)      tiles of queries x keys with an online softmax (the
//              FlashAttention recurrence): saves only the output and one logsumexp per row,
//              lse[B,NH,T]; the backward recomputes the probabilities tile by tile from q, k
//              and lse. Memory linear in T; no B*NH*T*T buffer anywhere.
//
// Both compute, for every sequence b, head h and query t (HS = C / NH, scale = 1/sqrt(HS)):
//   out[b,t,h*HS:(h+1)*HS] = sum_{t2 <= t} softmax_t2(scale * q_t . k_t2) * v_t2
// with q, k, v the head-h slices of qkv[B,T,3C] (q | k | v along the last dim). Both are
// OpenMP parallel; none is timed here (the backend times its calls).
#pragma once

namespace tier::train {

// ---- reference ----
// qkv[B,T,3C] -> out[B,T,C]; att[B,NH,T,T] receives the probabilities (0 above the diagonal).
void attention_forward_reference(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv[B,T,3C] (overwritten) from dout[B,T,C]; datt[B,NH,T,T] is scratch.
void attention_backward_reference(float* dqkv, float* datt, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH);

// ---- flash ----
// Query and key tile sizes (rows of q, rows of k and v that one tile step works on).
inline constexpr int kFlashTileQ = 64;
inline constexpr int kFlashTileK = 64;

// qkv[B,T,3C] -> out[B,T,C]; lse[B,NH,T] = log sum_{t2 <= t} exp(scale * q_t . k_t2).
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv[B,T,3C] (overwritten) from dout[B,T,C], given the forward's out[B,T,C] and lse[B,NH,T];
// drow[B,NH,T] is scratch (it receives D = rowsum(dout * out) per head).
void attention_backward_flash(float* dqkv, float* drow, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH);

}  // namespace tier::train
