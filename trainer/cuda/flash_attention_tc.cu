// Causal flash attention on the tensor cores: the recurrence of flash_attention.cu with the two
// products of each tile pair (S = Q Kᵀ, then P V; in the backward also dP = dO Vᵀ, dV += Pᵀ dO,
// dK += dSᵀ Q, dQ += dS K) as bf16 WMMA 16x16x16 products with fp32 accumulation. The softmax,
// its running max and sum, the logsumexp and D = rowsum(dO * O) stay fp32. Contracts in
// kernels.hpp. Compiled by nvcc as C++20, for sm_80 and up (bf16 WMMA).
//
// Layout as in flash_attention.cu: q, k, v read from qkv[B,T,3C] (fp32, rounded to bf16 as a
// tile is loaded into shared memory), out / dout [B,T,C], lse and drow [B,NH,T]. A block of
// 4 warps works on a tile of kRows = 64 rows of one (b, h); warp w owns rows 16w .. 16w + 15.
//
//   forward  block = (query tile, b*NH + h), over the key tiles up to the diagonal. A warp's
//            output rows O [16, HS] live in shared memory as fp32 (a WMMA accumulator's
//            element-to-row mapping is unspecified, so the per-row rescaling of the online
//            softmax is done there): O = O * exp(m - m') + P V per key tile.
//   dk, dv   block = (key tile, b*NH + h), over the query tiles from the diagonal on; dK and
//            dV accumulate in WMMA fragments (no rescaling in the backward).
//   dq       block = (query tile, b*NH + h), over the key tiles up to the diagonal.
// P is recomputed from q, k and lse in both backward kernels: each output element has one
// writer, no atomics, deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>

#include "kernels.hpp"

namespace tier::train::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kRows = 64;  // rows of a query or key tile
constexpr int kWarps = 4;  // warp w owns rows [16 w, 16 w + 16) of the block's tile
constexpr int kThreads = kWarps * 32;
constexpr int kM = 16;  // the WMMA tile edge

using FragA = wmma::fragment<wmma::matrix_a, kM, kM, kM, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kM, kM, kM, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kM, kM, kM, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kM, kM, kM, float>;

// dst[kRows, HS] (bf16) = rows [r0, r0 + kRows) of src (fp32, row stride `stride`, already at
// the head's first column); rows past T are 0. All threads of the block.
template <int HS> __device__ void load_tile(bf16* dst, const float* src, int r0, int T, int stride) {
  for (int idx = threadIdx.x; idx < kRows * HS; idx += kThreads) {
    const int r = idx / HS, c = idx % HS;
    dst[idx] = __float2bfloat16(r0 + r < T ? src[size_t(r0 + r) * stride + c] : 0.0f);
  }
}

// s[16, kRows] (fp32, row stride kRows) = a[16, HS] · b[kRows, HS]ᵀ; a and b bf16 row-major
// with row stride HS. One warp.
template <int HS> __device__ void products_abt(float* s, const bf16* a, const bf16* b) {
#pragma unroll
  for (int n = 0; n < kRows / kM; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < HS / kM; ++k) {
      FragA fa;
      FragBCol fb;  // bᵀ(k, n) = b[n][k]: b read column-major
      wmma::load_matrix_sync(fa, a + k * kM, HS);
      wmma::load_matrix_sync(fb, b + n * kM * HS + k * kM, HS);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(s + n * kM, acc, kRows, wmma::mem_row_major);
  }
}

// acc += p[16, kRows] · v[kRows, HS] restricted to columns [16 j, 16 j + 16); p bf16 with row
// stride kRows, v bf16 with row stride HS. One warp.
template <int HS> __device__ void product_ab_block(FragC& acc, const bf16* p, const bf16* v, int j) {
#pragma unroll
  for (int k = 0; k < kRows / kM; ++k) {
    FragA fa;
    FragBRow fb;
    wmma::load_matrix_sync(fa, p + k * kM, kRows);
    wmma::load_matrix_sync(fb, v + k * kM * HS + j * kM, HS);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// Writes the warp's 16 rows of `frags` (16 x HS) into dst rows row0 .. row0 + 15 (fp32, row
// stride `stride`) for rows < T, through `scratch` (16 x 16 fp32). One warp.
template <int HS>
__device__ void store_rows(float* dst, int row0, int T, int stride, FragC (&frags)[HS / kM], float* scratch) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < HS / kM; ++j) {
    wmma::store_matrix_sync(scratch, frags[j], kM, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < kM * kM; i += 32) {
      const int r = i / kM, c = i % kM;
      if (row0 + r < T) dst[size_t(row0 + r) * stride + j * kM + c] = scratch[i];
    }
    __syncwarp();
  }
}

// Shared memory of the forward: q, k, v tiles (bf16), then per warp S [16, kRows] and O
// [16, HS] and a row factor [16] (fp32), then per warp P [16, kRows] (bf16).
template <int HS> constexpr size_t forward_smem() {
  return 3 * size_t(kRows) * HS * sizeof(bf16) +
         kWarps * (size_t(kM) * kRows + kM * HS + kM) * sizeof(float) +
         kWarps * size_t(kM) * kRows * sizeof(bf16);
}

// grid (ceil(T / kRows), B*NH), kThreads threads, forward_smem<HS>() bytes.
template <int HS> __global__ void __launch_bounds__(kThreads)
    flash_forward_tc_k(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kRows * HS;
  bf16* vs = ks + kRows * HS;
  float* wf = reinterpret_cast<float*>(vs + kRows * HS) + warp * (kM * kRows + kM * HS + kM);
  float* sw = wf;                // S of the warp's rows, then scratch for P V blocks
  float* ow = sw + kM * kRows;   // O of the warp's rows, unnormalized
  float* factor = ow + kM * HS;  // per row: exp(m - m'), at the end 1 / l
  bf16* pw = reinterpret_cast<bf16*>(reinterpret_cast<float*>(vs + kRows * HS) +
                                     kWarps * (kM * kRows + kM * HS + kM)) +
             warp * kM * kRows;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, q0 = blockIdx.x * kRows, C3 = 3 * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * HS;  // q of row 0; + C: k, + 2C: v
  load_tile<HS>(qs, base, q0, T, C3);
  for (int i = lane; i < kM * HS; i += 32) ow[i] = 0.0f;
  // Softmax bookkeeping: lane pair (2r, 2r + 1) holds row r, each half of a tile's kRows keys.
  const int r = lane / 2, half = lane % 2;
  const int t = q0 + warp * kM + r;
  float m = -INFINITY, l = 0.0f;
  const int k_end = min(T, q0 + kRows);  // keys after the tile's last query are masked for all
  for (int k0 = 0; k0 < k_end; k0 += kRows) {
    __syncthreads();  // the previous tiles are no longer read (the first time: qs is loaded)
    load_tile<HS>(ks, base + C, k0, T, C3);
    load_tile<HS>(vs, base + 2 * C, k0, T, C3);
    __syncthreads();
    products_abt<HS>(sw, qs + warp * kM * HS, ks);
    __syncwarp();
    float* srow = sw + r * kRows + half * (kRows / 2);
    float mx = -INFINITY;
    for (int c = 0; c < kRows / 2; ++c) {
      const int key = k0 + half * (kRows / 2) + c;
      const float s = key <= t && key < T ? srow[c] * scale : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: all p = 0
    const float corr = expf(m - m_use);                     // 0 while m = -inf
    bf16* prow = pw + r * kRows + half * (kRows / 2);
    float sum = 0.0f;
    for (int c = 0; c < kRows / 2; ++c) {
      const float p = expf(srow[c] - m_use);
      prow[c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    if (half == 0) factor[r] = corr;
    __syncwarp();
    // O = O * corr + P V, 16 columns at a time through sw (S is no longer needed).
#pragma unroll
    for (int j = 0; j < HS / kM; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      product_ab_block<HS>(acc, pw, vs, j);
      wmma::store_matrix_sync(sw, acc, kM, wmma::mem_row_major);
      __syncwarp();
      for (int i = lane; i < kM * kM; i += 32) {
        const int rr = i / kM, cc = i % kM;
        float& o = ow[rr * HS + j * kM + cc];
        o = o * factor[rr] + sw[i];
      }
      __syncwarp();
    }
  }
  if (half == 0) {
    factor[r] = 1.0f / l;
    if (t < T) lse[(size_t(b) * NH + h) * T + t] = m + logf(l);
  }
  __syncwarp();
  for (int rr = 0; rr < kM; ++rr) {
    const int row = q0 + warp * kM + rr;
    if (row >= T) break;
    float* orow = out + (size_t(b) * T + row) * C + size_t(h) * HS;
    for (int c = lane; c < HS; c += 32) orow[c] = ow[rr * HS + c] * factor[rr];
  }
}

// Shared memory of both backward kernels: four bf16 tiles, two fp32 rows [kRows] (lse, D),
// per warp two fp32 [16, kRows] and two bf16 [16, kRows].
template <int HS> constexpr size_t backward_smem() {
  return 4 * size_t(kRows) * HS * sizeof(bf16) + 2 * size_t(kRows) * sizeof(float) +
         kWarps * (2 * size_t(kM) * kRows * sizeof(float) + 2 * size_t(kM) * kRows * sizeof(bf16));
}

// The backward's shared memory, carved.
template <int HS> struct BackwardSmem {
  bf16 *own_a, *own_b;      // the block's own tile: k, v (dk/dv) or q, dout (dq)
  bf16 *other_a, *other_b;  // the tile it iterates over: q, dout (dk/dv) or k, v (dq)
  float *ls, *ds;           // lse and D of the query tile in use
  float *s, *dp;            // the warp's [16, kRows] scores and dP
  bf16 *p, *dsb;            // the warp's [16, kRows] P and dS, bf16
  __device__ explicit BackwardSmem(unsigned char* smem) {
    const int warp = threadIdx.x / 32;
    own_a = reinterpret_cast<bf16*>(smem);
    own_b = own_a + kRows * HS;
    other_a = own_b + kRows * HS;
    other_b = other_a + kRows * HS;
    ls = reinterpret_cast<float*>(other_b + kRows * HS);
    ds = ls + kRows;
    s = ds + kRows + warp * 2 * kM * kRows;
    dp = s + kM * kRows;
    p = reinterpret_cast<bf16*>(ds + kRows + kWarps * 2 * kM * kRows) + warp * 2 * kM * kRows;
    dsb = p + kM * kRows;
  }
};

// lse and D of rows [q0, q0 + kRows) of one (b, h) into ls, ds (0 past T). All threads.
__device__ void load_rows(float* ls, float* ds, const float* lse_bh, const float* d_bh, int q0, int T) {
  for (int i = threadIdx.x; i < kRows; i += kThreads) {
    ls[i] = q0 + i < T ? lse_bh[q0 + i] : 0.0f;
    ds[i] = q0 + i < T ? d_bh[q0 + i] : 0.0f;
  }
}

// dk, dv of one key tile. grid (ceil(T / kRows), B*NH), kThreads, backward_smem<HS>().
template <int HS> __global__ void __launch_bounds__(kThreads)
    flash_dkdv_tc_k(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow,
                    int T, int C, int NH, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  BackwardSmem<HS> sm(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, k0 = blockIdx.x * kRows, C3 = 3 * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * HS;
  const float* gbase = dout + size_t(b) * T * C + size_t(h) * HS;
  const size_t bh = (size_t(b) * NH + h) * T;
  load_tile<HS>(sm.own_a, base + C, k0, T, C3);      // k
  load_tile<HS>(sm.own_b, base + 2 * C, k0, T, C3);  // v
  FragC dk[HS / kM], dv[HS / kM];
#pragma unroll
  for (int j = 0; j < HS / kM; ++j) {
    wmma::fill_fragment(dk[j], 0.0f);
    wmma::fill_fragment(dv[j], 0.0f);
  }
  const int r = lane / 2, half = lane % 2, key = k0 + warp * kM + r;
  for (int q0 = k0; q0 < T; q0 += kRows) {  // queries before k0 see none of these keys
    __syncthreads();
    load_tile<HS>(sm.other_a, base, q0, T, C3);  // q
    load_tile<HS>(sm.other_b, gbase, q0, T, C);  // dout
    load_rows(sm.ls, sm.ds, lse + bh, drow + bh, q0, T);
    __syncthreads();
    products_abt<HS>(sm.s, sm.own_a + warp * kM * HS, sm.other_a);   // Sᵀ = K Qᵀ  [keys, queries]
    products_abt<HS>(sm.dp, sm.own_b + warp * kM * HS, sm.other_b);  // dPᵀ = V dOᵀ
    __syncwarp();
    for (int c = half * (kRows / 2); c < (half + 1) * (kRows / 2); ++c) {
      const int q = q0 + c, i = r * kRows + c;
      const bool live = q < T && key <= q && key < T;
      const float p = live ? expf(sm.s[i] * scale - sm.ls[c]) : 0.0f;
      sm.p[i] = __float2bfloat16(p);
      sm.dsb[i] = __float2bfloat16(live ? p * (sm.dp[i] - sm.ds[c]) * scale : 0.0f);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HS / kM; ++j) {
      product_ab_block<HS>(dv[j], sm.p, sm.other_b, j);    // dV += Pᵀ dO
      product_ab_block<HS>(dk[j], sm.dsb, sm.other_a, j);  // dK += dSᵀ Q
    }
  }
  float* dbase = dqkv + size_t(b) * T * C3 + size_t(h) * HS;
  store_rows<HS>(dbase + C, k0 + warp * kM, T, C3, dk, sm.s);
  store_rows<HS>(dbase + 2 * C, k0 + warp * kM, T, C3, dv, sm.s);
}

// dq of one query tile. grid (ceil(T / kRows), B*NH), kThreads, backward_smem<HS>().
template <int HS> __global__ void __launch_bounds__(kThreads)
    flash_dq_tc_k(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* drow,
                  int T, int C, int NH, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  BackwardSmem<HS> sm(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, q0 = blockIdx.x * kRows, C3 = 3 * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * HS;
  const float* gbase = dout + size_t(b) * T * C + size_t(h) * HS;
  const size_t bh = (size_t(b) * NH + h) * T;
  load_tile<HS>(sm.own_a, base, q0, T, C3);  // q
  load_tile<HS>(sm.own_b, gbase, q0, T, C);  // dout
  load_rows(sm.ls, sm.ds, lse + bh, drow + bh, q0, T);
  FragC dq[HS / kM];
#pragma unroll
  for (int j = 0; j < HS / kM; ++j) wmma::fill_fragment(dq[j], 0.0f);
  const int r = lane / 2, half = lane % 2, row = warp * kM + r, q = q0 + row;
  const int k_end = min(T, q0 + kRows);
  for (int k0 = 0; k0 < k_end; k0 += kRows) {
    __syncthreads();
    load_tile<HS>(sm.other_a, base + C, k0, T, C3);      // k
    load_tile<HS>(sm.other_b, base + 2 * C, k0, T, C3);  // v
    __syncthreads();
    products_abt<HS>(sm.s, sm.own_a + warp * kM * HS, sm.other_a);   // S = Q Kᵀ
    products_abt<HS>(sm.dp, sm.own_b + warp * kM * HS, sm.other_b);  // dP = dO Vᵀ
    __syncwarp();
    for (int c = half * (kRows / 2); c < (half + 1) * (kRows / 2); ++c) {
      const int key = k0 + c, i = r * kRows + c;
      const bool live = q < T && key <= q && key < T;
      const float p = live ? expf(sm.s[i] * scale - sm.ls[row]) : 0.0f;
      sm.dsb[i] = __float2bfloat16(live ? p * (sm.dp[i] - sm.ds[row]) * scale : 0.0f);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HS / kM; ++j) product_ab_block<HS>(dq[j], sm.dsb, sm.other_a, j);  // dQ += dS K
  }
  store_rows<HS>(dqkv + size_t(b) * T * C3 + size_t(h) * HS, q0 + warp * kM, T, C3, dq, sm.s);
}

template <class Kernel, class... Args>
cudaError_t launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t s, Args... args) {
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<grid, kThreads, smem, s>>>(args...);
  return cudaGetLastError();
}

template <int HS>
cudaError_t forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  return launch(flash_forward_tc_k<HS>, grid, forward_smem<HS>(), s, out, lse, qkv, T, C, NH, scale);
}

template <int HS> cudaError_t backward(float* dqkv, const float* drow, const float* dout, const float* qkv,
                                       const float* lse, int B, int T, int C, int NH, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const cudaError_t e =
      launch(flash_dkdv_tc_k<HS>, grid, backward_smem<HS>(), s, dqkv, dout, qkv, lse, drow, T, C, NH, scale);
  if (e != cudaSuccess) return e;
  return launch(flash_dq_tc_k<HS>, grid, backward_smem<HS>(), s, dqkv, dout, qkv, lse, drow, T, C, NH, scale);
}

}  // namespace

bool flash_attention_tc_supported(int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0 || C % NH != 0 || size_t(B) * NH > 65535) return false;
  const int HS = C / NH;
  return HS == 32 || HS == 64 || HS == 128;
}

cudaError_t flash_attention_forward_tc(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                                       cudaStream_t s) {
  if (!flash_attention_tc_supported(B, T, C, NH)) return cudaErrorInvalidValue;
  switch (C / NH) {
    case 32: return forward<32>(out, lse, qkv, B, T, C, NH, s);
    case 64: return forward<64>(out, lse, qkv, B, T, C, NH, s);
    default: return forward<128>(out, lse, qkv, B, T, C, NH, s);
  }
}

cudaError_t flash_attention_backward_tc(float* dqkv, float* drow, const float* dout, const float* qkv,
                                        const float* out, const float* lse, int B, int T, int C, int NH,
                                        cudaStream_t s) {
  if (!flash_attention_tc_supported(B, T, C, NH)) return cudaErrorInvalidValue;
  if (const cudaError_t e = flash_attention_rowdot(drow, dout, out, B, T, C, NH, s); e != cudaSuccess)
    return e;
  switch (C / NH) {
    case 32: return backward<32>(dqkv, drow, dout, qkv, lse, B, T, C, NH, s);
    case 64: return backward<64>(dqkv, drow, dout, qkv, lse, B, T, C, NH, s);
    default: return backward<128>(dqkv, drow, dout, qkv, lse, B, T, C, NH, s);
  }
}

}  // namespace tier::train::cuda
