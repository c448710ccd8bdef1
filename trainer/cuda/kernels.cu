// The CUDA kernels of the tier-train CUDA backend (see kernels.hpp for each contract).
// Compiled by nvcc as C++20; fp32 storage, fp32 math (bf16 only in the conversion kernels and
// the AdamW working-copy output). Row kernels use one warp per row; column reductions split the
// rows into chunks and add each chunk's partial sum atomically.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels.hpp"

namespace tier::train::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kRowsPerChunk = 128;  // column reductions: rows summed per thread before the atomic

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<size_t>(blocks, 1, size_t{1} << 20));
}

unsigned grid_for_rows(int rows) {
  return static_cast<unsigned>(std::max(1, (rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions for blockDim.x == kThreads; `sh` holds kWarpsPerBlock floats. Every
// thread gets the result.
__device__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read from a previous reduction
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < kWarpsPerBlock ? sh[lane] : 0.0f;
  return warp_sum(r);
}
__device__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < kWarpsPerBlock ? sh[lane] : -INFINITY;
  return warp_max(r);
}

#define GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (n); i += size_t{gridDim.x} * blockDim.x)

// ---- embedding ----

__global__ void encoder_forward_k(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                  int B, int T, int C) {
  const size_t n = size_t(B) * T * C;
  GRID_STRIDE(i, n) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    out[i] = wte[size_t(tokens[bt]) * C + c] + wpe[size_t(t) * C + c];
  }
}

__global__ void encoder_backward_wte_k(float* dwte, const float* dout, const int32_t* tokens, int B, int T,
                                       int C) {
  const size_t n = size_t(B) * T * C;
  GRID_STRIDE(i, n) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    atomicAdd(&dwte[size_t(tokens[bt]) * C + c], dout[i]);
  }
}

__global__ void encoder_backward_wpe_k(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t n = size_t(T) * C;
  GRID_STRIDE(i, n) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += dout[size_t(b) * T * C + i];
    dwpe[i] += s;
  }
}

// ---- LayerNorm ----

__global__ void layernorm_forward_k(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                    const float* b, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / C + 1e-5f);
  float* o = out + size_t(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * rs * w[c] + b[c];
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = rs;
  }
}

__global__ void layernorm_backward_inp_k(float* dinp, const float* dout, const float* inp, const float* w,
                                         const float* mean, const float* rstd, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const size_t base = size_t(row) * C;
  const float m = mean[row], rs = rstd[row];
  float sd = 0.0f, sdn = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (inp[base + c] - m) * rs;
    const float dnorm = w[c] * dout[base + c];
    sd += dnorm;
    sdn += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(sd) / C;
  const float dnorm_norm_mean = warp_sum(sdn) / C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (inp[base + c] - m) * rs;
    const float dnorm = w[c] * dout[base + c];
    dinp[base + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
  }
}

// grid: (ceil(C / kThreads), ceil(N / kRowsPerChunk)); one column per thread, one chunk per y.
__global__ void layernorm_backward_params_k(float* dw, float* db, const float* dout, const float* inp,
                                            const float* mean, const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = blockIdx.y * kRowsPerChunk, r1 = min(N, r0 + kRowsPerChunk);
  float sw = 0.0f, sb = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const size_t i = size_t(r) * C + c;
    sw += dout[i] * (inp[i] - mean[r]) * rstd[r];
    sb += dout[i];
  }
  atomicAdd(&dw[c], sw);
  atomicAdd(&db[c], sb);
}

__global__ void column_sum_acc_k(float* dst, const float* src, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const int r0 = blockIdx.y * kRowsPerChunk, r1 = min(N, r0 + kRowsPerChunk);
  float s = 0.0f;
  for (int r = r0; r < r1; ++r) s += src[size_t(r) * OC + c];
  atomicAdd(&dst[c], s);
}

// ---- elementwise ----

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__global__ void gelu_forward_k(float* out, const float* inp, size_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

__global__ void gelu_backward_k(float* dinp, const float* inp, const float* dout, size_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = g * dout[i];
  }
}

__global__ void add_k(float* out, const float* a, const float* b, size_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void add_bias_k(float* out, const float* bias, int N, int OC) {
  const size_t n = size_t(N) * OC;
  GRID_STRIDE(i, n) out[i] += bias[i % OC];
}

__global__ void scale_k(float* p, float s, size_t n) { GRID_STRIDE(i, n) p[i] *= s; }

// ---- attention helpers ----

// Element i of a [B, NH, T, HS] tensor (HS = C / NH) is element (b, t, h·HS + hs) of a token-major
// tensor whose rows are `row` floats apart: returns that element's offset.
__device__ __forceinline__ size_t token_major_offset(size_t i, int T, int C, int NH, size_t row) {
  const int HS = C / NH;
  const int hs = static_cast<int>(i % HS);
  const int t = static_cast<int>((i / HS) % T);
  const int h = static_cast<int>((i / (size_t(HS) * T)) % NH);
  const size_t b = i / (size_t(HS) * T * NH);
  return (b * T + t) * row + size_t(h) * HS + hs;
}

__global__ void split_heads_k(float* q, float* k, float* v, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const size_t n = size_t(B) * NH * T * HS;
  GRID_STRIDE(i, n) {
    const size_t src = token_major_offset(i, T, C, NH, 3 * size_t(C));
    q[i] = qkv[src];
    k[i] = qkv[src + C];
    v[i] = qkv[src + 2 * size_t(C)];
  }
}

__global__ void merge_heads_qkv_k(float* dqkv, const float* dq, const float* dk, const float* dv, int B,
                                  int T, int C, int NH) {
  const int HS = C / NH;
  const size_t n = size_t(B) * NH * T * HS;
  GRID_STRIDE(i, n) {
    const size_t dst = token_major_offset(i, T, C, NH, 3 * size_t(C));
    dqkv[dst] = dq[i];
    dqkv[dst + C] = dk[i];
    dqkv[dst + 2 * size_t(C)] = dv[i];
  }
}

// to_btc: y[b,h,t,hs] → out[b,t,h*HS+hs]; otherwise the reverse.
__global__ void permute_heads_k(float* out, const float* in, int B, int T, int C, int NH, bool to_btc) {
  const int HS = C / NH;
  const size_t n = size_t(B) * NH * T * HS;
  GRID_STRIDE(i, n) {
    const size_t btc = token_major_offset(i, T, C, NH, size_t(C));
    if (to_btc) out[btc] = in[i];
    else out[i] = in[btc];
  }
}

__global__ void causal_softmax_forward_k(float* att, const float* preatt, float scale, int rows, int T) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int t = row % T;
  const float* x = preatt + size_t(row) * T;
  float* y = att + size_t(row) * T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, scale * x[j]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j <= t; j += 32) s += expf(scale * x[j] - mx);
  const float inv = 1.0f / warp_sum(s);
  for (int j = lane; j < T; j += 32) y[j] = j <= t ? expf(scale * x[j] - mx) * inv : 0.0f;
}

__global__ void causal_softmax_backward_k(float* dpreatt, const float* att, const float* datt, float scale,
                                          int rows, int T) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int t = row % T;
  const size_t base = size_t(row) * T;
  float s = 0.0f;
  for (int j = lane; j <= t; j += 32) s += att[base + j] * datt[base + j];
  s = warp_sum(s);
  for (int j = lane; j < T; j += 32)
    dpreatt[base + j] = j <= t ? scale * att[base + j] * (datt[base + j] - s) : 0.0f;
}

// ---- loss ----

// One block per row.
__global__ void cross_entropy_k(float* losses, float* logits, const int32_t* targets, int V, float dscale) {
  __shared__ float sh[kWarpsPerBlock];
  const size_t row = blockIdx.x;
  float* x = logits + row * V;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, sh);
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - mx);
  s = block_sum(s, sh);
  const int tgt = targets[row];
  const float xt = x[tgt];  // read by every thread before anyone overwrites the row
  __syncthreads();
  if (threadIdx.x == 0) losses[row] = logf(s) + mx - xt;
  if (dscale != 0.0f) {
    const float inv = 1.0f / s;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      x[i] = dscale * (expf(x[i] - mx) * inv - (i == tgt ? 1.0f : 0.0f));
  }
}

__global__ void sum_to_double_k(double* out, const float* in, size_t n) {
  __shared__ double sh[kThreads];
  double s = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0];
}

// ---- optimizer, precision ----

// fp32 -> bf16 bits, round to nearest even in integer arithmetic: the same bits as the host's
// tier::train::bf16_from_f32 (trainer/bf16.hpp) for every input, NaN included (quieted, sign and
// upper payload kept), so a value rounded here or on the host is the same value.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void adamw_k(float* p, const float* g, float* m, float* v, uint16_t* out, size_t n, float lr,
                        float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale) {
  GRID_STRIDE(i, n) {
    const float gi = g[i] * gscale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    const float pi = p[i] - lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (out) out[i] = bf16_bits(pi);
  }
}

__global__ void f32_to_bf16_k(uint16_t* out, const float* in, size_t n) {
  GRID_STRIDE(i, n) out[i] = bf16_bits(in[i]);
}

// Exact: the bf16 bits are the upper half of the float.
__global__ void bf16_to_f32_k(float* out, const uint16_t* in, size_t n) {
  GRID_STRIDE(i, n) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

dim3 column_grid(int N, int OC) {
  return dim3(static_cast<unsigned>((OC + kThreads - 1) / kThreads),
              static_cast<unsigned>(std::max(1, (N + kRowsPerChunk - 1) / kRowsPerChunk)));
}

}  // namespace

// ---- launchers ----

cudaError_t encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                            int T, int C, cudaStream_t s) {
  encoder_forward_k<<<grid_for(size_t(B) * T * C), kThreads, 0, s>>>(out, tokens, wte, wpe, B, T, C);
  return cudaGetLastError();
}

cudaError_t encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                             int C, cudaStream_t s) {
  encoder_backward_wte_k<<<grid_for(size_t(B) * T * C), kThreads, 0, s>>>(dwte, dout, tokens, B, T, C);
  encoder_backward_wpe_k<<<grid_for(size_t(T) * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

cudaError_t layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                              const float* b, int N, int C, cudaStream_t s) {
  layernorm_forward_k<<<grid_for_rows(N), kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                               const float* w, const float* mean, const float* rstd, int N, int C,
                               cudaStream_t s) {
  layernorm_backward_inp_k<<<grid_for_rows(N), kThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  layernorm_backward_params_k<<<column_grid(N, C), kThreads, 0, s>>>(dw, db, dout, inp, mean, rstd, N, C);
  return cudaGetLastError();
}

cudaError_t gelu_forward(float* out, const float* inp, size_t n, cudaStream_t s) {
  gelu_forward_k<<<grid_for(n), kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, cudaStream_t s) {
  gelu_backward_k<<<grid_for(n), kThreads, 0, s>>>(dinp, inp, dout, n);
  return cudaGetLastError();
}

cudaError_t add(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  add_k<<<grid_for(n), kThreads, 0, s>>>(out, a, b, n);
  return cudaGetLastError();
}

cudaError_t add_bias(float* out, const float* bias, int N, int OC, cudaStream_t s) {
  add_bias_k<<<grid_for(size_t(N) * OC), kThreads, 0, s>>>(out, bias, N, OC);
  return cudaGetLastError();
}

cudaError_t column_sum_acc(float* dst, const float* src, int N, int OC, cudaStream_t s) {
  column_sum_acc_k<<<column_grid(N, OC), kThreads, 0, s>>>(dst, src, N, OC);
  return cudaGetLastError();
}

cudaError_t scale(float* p, float f, size_t n, cudaStream_t s) {
  scale_k<<<grid_for(n), kThreads, 0, s>>>(p, f, n);
  return cudaGetLastError();
}

cudaError_t attention_split_heads(float* q, float* k, float* v, const float* qkv, int B, int T, int C, int NH,
                                  cudaStream_t s) {
  split_heads_k<<<grid_for(size_t(B) * T * C), kThreads, 0, s>>>(q, k, v, qkv, B, T, C, NH);
  return cudaGetLastError();
}

cudaError_t attention_merge_heads_qkv(float* dqkv, const float* dq, const float* dk, const float* dv, int B,
                                      int T, int C, int NH, cudaStream_t s) {
  merge_heads_qkv_k<<<grid_for(size_t(B) * T * C), kThreads, 0, s>>>(dqkv, dq, dk, dv, B, T, C, NH);
  return cudaGetLastError();
}

cudaError_t attention_merge_heads(float* out, const float* y, int B, int T, int C, int NH, cudaStream_t s) {
  permute_heads_k<<<grid_for(size_t(B) * T * C), kThreads, 0, s>>>(out, y, B, T, C, NH, true);
  return cudaGetLastError();
}

cudaError_t attention_split_out(float* y, const float* inp, int B, int T, int C, int NH, cudaStream_t s) {
  permute_heads_k<<<grid_for(size_t(B) * T * C), kThreads, 0, s>>>(y, inp, B, T, C, NH, false);
  return cudaGetLastError();
}

cudaError_t causal_softmax_forward(float* att, const float* preatt, float f, int rows, int T,
                                   cudaStream_t s) {
  causal_softmax_forward_k<<<grid_for_rows(rows), kThreads, 0, s>>>(att, preatt, f, rows, T);
  return cudaGetLastError();
}

cudaError_t causal_softmax_backward(float* dpreatt, const float* att, const float* datt, float f, int rows,
                                    int T, cudaStream_t s) {
  causal_softmax_backward_k<<<grid_for_rows(rows), kThreads, 0, s>>>(dpreatt, att, datt, f, rows, T);
  return cudaGetLastError();
}

cudaError_t cross_entropy(float* losses, float* logits, const int32_t* targets, int N, int V, float dscale,
                          cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  cross_entropy_k<<<static_cast<unsigned>(N), kThreads, 0, s>>>(losses, logits, targets, V, dscale);
  return cudaGetLastError();
}

cudaError_t sum_to_double(double* out, const float* in, size_t n, cudaStream_t s) {
  sum_to_double_k<<<1, kThreads, 0, s>>>(out, in, n);
  return cudaGetLastError();
}

cudaError_t adamw(float* p, const float* g, float* m, float* v, uint16_t* bf16_out, size_t n, const AdamW& h,
                  cudaStream_t s) {
  // Bias corrections in double, as the CPU optimizer (trainer/optimizer.cpp) computes them.
  const float bc1 = static_cast<float>(1.0 - std::pow(double(h.beta1), double(h.step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(double(h.beta2), double(h.step)));
  adamw_k<<<grid_for(n), kThreads, 0, s>>>(p, g, m, v, bf16_out, n, h.lr, h.beta1, h.beta2, h.eps,
                                           h.weight_decay, bc1, bc2, h.grad_scale);
  return cudaGetLastError();
}

cudaError_t f32_to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t s) {
  f32_to_bf16_k<<<grid_for(n), kThreads, 0, s>>>(out, in, n);
  return cudaGetLastError();
}

cudaError_t bf16_to_f32(float* out, const uint16_t* in, size_t n, cudaStream_t s) {
  bf16_to_f32_k<<<grid_for(n), kThreads, 0, s>>>(out, in, n);
  return cudaGetLastError();
}

}  // namespace tier::train::cuda
