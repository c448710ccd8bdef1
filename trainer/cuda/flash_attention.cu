// Tiled causal attention with an online softmax (the FlashAttention recurrence) on the GPU, fp32:
// the CUDA side of trainer/cpu/flash_attention.cpp (the recurrence is written out there).
// Contracts in kernels.hpp. Compiled by nvcc as C++20.
//
// Layout: q, k, v are read straight from qkv[B,T,3C] (head h: columns h*HS of each third);
// out and dout are [B,T,C]; lse and drow [B,NH,T]. One block of 8 warps works on a tile of
// kTile = 32 rows of one (b, h); each warp owns kTile / 8 = 4 of them, one at a time, and its
// 32 lanes split the head dimension (lane i holds elements i, i + 32, ...: NC = ceil(HS / 32)
// registers per vector). The other side's tiles (keys in the forward and dq, queries in
// dk/dv) pass through shared memory, [kTile, HS] each. A dot product over HS is a warp sum.
//
//   forward    block = (query tile, b*NH + h): for each key tile up to the diagonal, per row
//              and key: m' = max(m, s), o = o*exp(m - m') + exp(s - m') v, l likewise.
//   backward   D = rowsum(dout * out) (one warp per row); dk, dv: block = (key tile, b*NH+h),
//              over the query tiles from the diagonal on; dq: block = (query tile, b*NH+h),
//              over the key tiles up to the diagonal. P is recomputed from q, k and lse in
//              both, so each output element has one writer: no atomics, deterministic.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels.hpp"

namespace tier::train::cuda {
namespace {

constexpr int kTile = 32;                     // rows of a query or key tile
constexpr int kWarps = 8;                     // warps per block
constexpr int kRowsPerWarp = kTile / kWarps;  // rows (queries or keys) each warp owns
constexpr int kMaxHS = 256;                   // largest head size: NC <= 8 registers per vector

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Loads rows [r0, r0 + kTile) of one third of qkv (or of a [B,T,C] buffer with row stride
// `stride`), columns [col, col + HS), into dst[kTile, HS]; rows past T read 0. All threads.
__device__ void load_tile(float* dst, const float* src, int r0, int T, int stride, int HS) {
  for (int idx = threadIdx.x; idx < kTile * HS; idx += blockDim.x) {
    const int r = idx / HS, i = idx % HS;
    dst[idx] = r0 + r < T ? src[size_t(r0 + r) * stride + i] : 0.0f;
  }
}

// One row of HS in lane layout: v[j] = row[lane + 32 j].
template <int NC>
__device__ __forceinline__ void load_row(float (&v)[NC], const float* row, int HS, int lane) {
#pragma unroll
  for (int j = 0; j < NC; ++j) v[j] = lane + 32 * j < HS ? row[lane + 32 * j] : 0.0f;
}
template <int NC>
__device__ __forceinline__ void store_row(float* row, const float (&v)[NC], float f, int HS, int lane) {
#pragma unroll
  for (int j = 0; j < NC; ++j)
    if (lane + 32 * j < HS) row[lane + 32 * j] = v[j] * f;
}
// a . b over HS, b a row of a shared tile; every lane gets the sum.
template <int NC>
__device__ __forceinline__ float dot_row(const float (&a)[NC], const float* b, int HS, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NC; ++j)
    if (lane + 32 * j < HS) s += a[j] * b[lane + 32 * j];
  return warp_sum(s);
}

// grid (ceil(T / kTile), B*NH); dynamic shared memory 2 * kTile * HS floats.
template <int NC>
__global__ void flash_forward_k(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  extern __shared__ float sh[];
  const int HS = C / NH, C3 = 3 * C;
  float* ks = sh;               // [kTile, HS] keys of the current tile
  float* vs = sh + kTile * HS;  // [kTile, HS] their values
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, q0 = blockIdx.x * kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * HS;  // q of row 0; + C: k, + 2C: v
  float q[kRowsPerWarp][NC], o[kRowsPerWarp][NC], m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    if (t < T) load_row(q[rr], base + size_t(t) * C3, HS, lane);
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      if (t >= T) q[rr][j] = 0.0f;
      q[rr][j] *= scale;  // s = (scale q) . k
      o[rr][j] = 0.0f;
    }
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
  }
  const int k_end = min(T, q0 + kTile);  // keys after the tile's last query are masked for all
  for (int k0 = 0; k0 < k_end; k0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile(ks, base + C, k0, T, C3, HS);
    load_tile(vs, base + 2 * C, k0, T, C3, HS);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int t = q0 + warp * kRowsPerWarp + rr;       // the same in every lane of the warp
      const int n = t < T ? min(kTile, t - k0 + 1) : 0;  // keys k0..t of this tile (causal)
      for (int c = 0; c < n; ++c) {
        const float s = dot_row(q[rr], ks + c * HS, HS, lane);
        const float m_new = fmaxf(m[rr], s);
        const float corr = expf(m[rr] - m_new);  // 0 for the row's first key (m = -inf)
        const float p = expf(s - m_new);
        l[rr] = l[rr] * corr + p;
        m[rr] = m_new;
#pragma unroll
        for (int j = 0; j < NC; ++j)
          o[rr][j] = o[rr][j] * corr + (lane + 32 * j < HS ? p * vs[c * HS + lane + 32 * j] : 0.0f);
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    if (t >= T) continue;
    store_row(out + (size_t(b) * T + t) * C + size_t(h) * HS, o[rr], 1.0f / l[rr], HS, lane);
    if (lane == 0) lse[(size_t(b) * NH + h) * T + t] = m[rr] + logf(l[rr]);
  }
}

// drow[b,h,t] = dout[b,t,h*HS:] . out[b,t,h*HS:]; one warp per (b, h, t) row.
__global__ void flash_rowdot_k(float* drow, const float* dout, const float* out, int B, int T, int C,
                               int NH) {
  const int lane = threadIdx.x % 32;
  const size_t row = size_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // (b*NH + h)*T + t
  if (row >= size_t(B) * NH * T) return;
  const int HS = C / NH, t = static_cast<int>(row % T), h = static_cast<int>((row / T) % NH);
  const size_t b = row / (size_t(T) * NH);
  const size_t off = (b * T + t) * C + size_t(h) * HS;
  float s = 0.0f;
  for (int i = lane; i < HS; i += 32) s += dout[off + i] * out[off + i];
  s = warp_sum(s);
  if (lane == 0) drow[row] = s;
}

// dk, dv of one key tile. grid (ceil(T / kTile), B*NH); shared 2 * kTile * HS + 2 * kTile.
template <int NC> __global__ void flash_backward_dkdv_k(float* dqkv, const float* dout, const float* qkv,
                                                        const float* lse, const float* drow, int T, int C,
                                                        int NH, float scale) {
  extern __shared__ float sh[];
  const int HS = C / NH, C3 = 3 * C;
  float* qs = sh;               // [kTile, HS] queries of the current tile
  float* gs = qs + kTile * HS;  // [kTile, HS] their dout
  float* ls = gs + kTile * HS;  // [kTile] their lse
  float* Ds = ls + kTile;       // [kTile] their D = rowsum(dout * out)
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, k0 = blockIdx.x * kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * HS;
  const float* gbase = dout + size_t(b) * T * C + size_t(h) * HS;
  const float* lse_bh = lse + (size_t(b) * NH + h) * T;
  const float* d_bh = drow + (size_t(b) * NH + h) * T;
  float k[kRowsPerWarp][NC], v[kRowsPerWarp][NC], dk[kRowsPerWarp][NC], dv[kRowsPerWarp][NC];
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk) {
    const int key = k0 + warp * kRowsPerWarp + kk;
    const int row = key < T ? key : 0;  // rows past T compute nothing below
    load_row(k[kk], base + size_t(row) * C3 + C, HS, lane);
    load_row(v[kk], base + size_t(row) * C3 + 2 * C, HS, lane);
#pragma unroll
    for (int j = 0; j < NC; ++j) dk[kk][j] = dv[kk][j] = 0.0f;
  }
  for (int q0 = k0; q0 < T; q0 += kTile) {  // queries before k0 see none of these keys
    __syncthreads();
    load_tile(qs, base, q0, T, C3, HS);
    load_tile(gs, gbase, q0, T, C, HS);
    for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
      ls[r] = q0 + r < T ? lse_bh[q0 + r] : 0.0f;
      Ds[r] = q0 + r < T ? d_bh[q0 + r] : 0.0f;
    }
    __syncthreads();
    const int nq = min(kTile, T - q0);
    for (int r = 0; r < nq; ++r) {
      const int t = q0 + r;
      const float* qr = qs + r * HS;
      const float* gr = gs + r * HS;
#pragma unroll
      for (int kk = 0; kk < kRowsPerWarp; ++kk) {
        const int key = k0 + warp * kRowsPerWarp + kk;
        if (key > t) continue;  // masked (also every key >= T, as t < T); uniform in the warp
        const float p = expf(scale * dot_row(k[kk], qr, HS, lane) - ls[r]);
        const float dp = dot_row(v[kk], gr, HS, lane);
        const float ds = scale * p * (dp - Ds[r]);
#pragma unroll
        for (int j = 0; j < NC; ++j) {
          if (lane + 32 * j >= HS) continue;
          dv[kk][j] += p * gr[lane + 32 * j];
          dk[kk][j] += ds * qr[lane + 32 * j];
        }
      }
    }
  }
  float* dbase = dqkv + size_t(b) * T * C3 + size_t(h) * HS;
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk) {
    const int key = k0 + warp * kRowsPerWarp + kk;
    if (key >= T) continue;
    store_row(dbase + size_t(key) * C3 + C, dk[kk], 1.0f, HS, lane);
    store_row(dbase + size_t(key) * C3 + 2 * C, dv[kk], 1.0f, HS, lane);
  }
}

// dq of one query tile. grid (ceil(T / kTile), B*NH); shared 2 * kTile * HS.
template <int NC> __global__ void flash_backward_dq_k(float* dqkv, const float* dout, const float* qkv,
                                                      const float* lse, const float* drow, int T, int C,
                                                      int NH, float scale) {
  extern __shared__ float sh[];
  const int HS = C / NH, C3 = 3 * C;
  float* ks = sh;               // [kTile, HS]
  float* vs = sh + kTile * HS;  // [kTile, HS]
  const int b = blockIdx.y / NH, h = blockIdx.y % NH, q0 = blockIdx.x * kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * HS;
  const float* gbase = dout + size_t(b) * T * C + size_t(h) * HS;
  float q[kRowsPerWarp][NC], g[kRowsPerWarp][NC], dq[kRowsPerWarp][NC], lr[kRowsPerWarp], dr[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    const int row = t < T ? t : 0;  // rows past T compute nothing below
    load_row(q[rr], base + size_t(row) * C3, HS, lane);
    load_row(g[rr], gbase + size_t(row) * C, HS, lane);
    lr[rr] = lse[(size_t(b) * NH + h) * T + row];
    dr[rr] = drow[(size_t(b) * NH + h) * T + row];
#pragma unroll
    for (int j = 0; j < NC; ++j) dq[rr][j] = 0.0f;
  }
  const int k_end = min(T, q0 + kTile);
  for (int k0 = 0; k0 < k_end; k0 += kTile) {
    __syncthreads();
    load_tile(ks, base + C, k0, T, C3, HS);
    load_tile(vs, base + 2 * C, k0, T, C3, HS);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int t = q0 + warp * kRowsPerWarp + rr;
      const int n = t < T ? min(kTile, t - k0 + 1) : 0;  // keys k0..t (causal)
      for (int c = 0; c < n; ++c) {
        const float p = expf(scale * dot_row(q[rr], ks + c * HS, HS, lane) - lr[rr]);
        const float dp = dot_row(g[rr], vs + c * HS, HS, lane);
        const float ds = scale * p * (dp - dr[rr]);
#pragma unroll
        for (int j = 0; j < NC; ++j)
          if (lane + 32 * j < HS) dq[rr][j] += ds * ks[c * HS + lane + 32 * j];
      }
    }
  }
  float* dbase = dqkv + size_t(b) * T * C3 + size_t(h) * HS;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = q0 + warp * kRowsPerWarp + rr;
    if (t < T) store_row(dbase + size_t(t) * C3, dq[rr], 1.0f, HS, lane);
  }
}

// Registers per vector for head size HS: the smallest NC of 1, 2, 4, 8 with 32 * NC >= HS.
int nc_for(int HS) { return HS <= 32 ? 1 : HS <= 64 ? 2 : HS <= 128 ? 4 : 8; }

// Launches `kernel` with `smem` bytes of dynamic shared memory, raising the kernel's limit past
// the default 48 KiB when needed (HS > 192).
template <class Kernel, class... Args>
cudaError_t launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t s, Args... args) {
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<grid, kWarps * 32, smem, s>>>(args...);
  return cudaGetLastError();
}

// The launch geometry's limits: head size (registers, shared memory) and grid.y = B * NH.
bool shape_ok(int B, int T, int C, int NH) {
  return B > 0 && T > 0 && NH > 0 && C % NH == 0 && C / NH <= kMaxHS && size_t(B) * NH <= 65535;
}

}  // namespace

cudaError_t flash_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                                    cudaStream_t s) {
  if (!shape_ok(B, T, C, NH)) return cudaErrorInvalidValue;
  const int HS = C / NH;
  const dim3 grid(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const size_t smem = size_t(2) * kTile * HS * sizeof(float);
  switch (nc_for(HS)) {
    case 1: return launch(flash_forward_k<1>, grid, smem, s, out, lse, qkv, T, C, NH, scale);
    case 2: return launch(flash_forward_k<2>, grid, smem, s, out, lse, qkv, T, C, NH, scale);
    case 4: return launch(flash_forward_k<4>, grid, smem, s, out, lse, qkv, T, C, NH, scale);
    default: return launch(flash_forward_k<8>, grid, smem, s, out, lse, qkv, T, C, NH, scale);
  }
}

cudaError_t flash_attention_rowdot(float* drow, const float* dout, const float* out, int B, int T, int C,
                                   int NH, cudaStream_t s) {
  const size_t rows = size_t(B) * NH * T;
  flash_rowdot_k<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(drow, dout, out,
                                                                                             B, T, C, NH);
  return cudaGetLastError();
}

cudaError_t flash_attention_backward(float* dqkv, float* drow, const float* dout, const float* qkv,
                                     const float* out, const float* lse, int B, int T, int C, int NH,
                                     cudaStream_t s) {
  if (!shape_ok(B, T, C, NH)) return cudaErrorInvalidValue;
  const int HS = C / NH;
  if (const cudaError_t e = flash_attention_rowdot(drow, dout, out, B, T, C, NH, s); e != cudaSuccess)
    return e;
  const dim3 grid(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const size_t tiles = size_t(2) * kTile * HS * sizeof(float), rowvals = size_t(2) * kTile * sizeof(float);
  cudaError_t e = cudaSuccess;
  switch (nc_for(HS)) {
    case 1:
      e = launch(flash_backward_dkdv_k<1>, grid, tiles + rowvals, s, dqkv, dout, qkv, lse, drow, T, C, NH,
                 scale);
      break;
    case 2:
      e = launch(flash_backward_dkdv_k<2>, grid, tiles + rowvals, s, dqkv, dout, qkv, lse, drow, T, C, NH,
                 scale);
      break;
    case 4:
      e = launch(flash_backward_dkdv_k<4>, grid, tiles + rowvals, s, dqkv, dout, qkv, lse, drow, T, C, NH,
                 scale);
      break;
    default:
      e = launch(flash_backward_dkdv_k<8>, grid, tiles + rowvals, s, dqkv, dout, qkv, lse, drow, T, C, NH,
                 scale);
  }
  if (e != cudaSuccess) return e;
  switch (nc_for(HS)) {
    case 1:
      return launch(flash_backward_dq_k<1>, grid, tiles, s, dqkv, dout, qkv, lse, drow, T, C, NH, scale);
    case 2:
      return launch(flash_backward_dq_k<2>, grid, tiles, s, dqkv, dout, qkv, lse, drow, T, C, NH, scale);
    case 4:
      return launch(flash_backward_dq_k<4>, grid, tiles, s, dqkv, dout, qkv, lse, drow, T, C, NH, scale);
    default:
      return launch(flash_backward_dq_k<8>, grid, tiles, s, dqkv, dout, qkv, lse, drow, T, C, NH, scale);
  }
}

}  // namespace tier::train::cuda
