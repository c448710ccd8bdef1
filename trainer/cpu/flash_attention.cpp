// Tiled causal attention with an online softmax (the FlashAttention recurrence) on the CPU:
// memory linear in T. Contracts in attention.hpp. Per sequence b and head h (HS = C / NH,
// scale = 1/sqrt(HS)), row t of the scores is s[t,t2] = scale * q_t . k_t2 for t2 <= t.
//
// Forward, per tile of kFlashTileQ queries, over the key tiles of kFlashTileK keys up to the
// tile's last query (the causal mask cuts the rest), each row t keeps a running maximum m_t,
// a running sum l_t and an unnormalized output o_t:
//   m' = max(m, max_t2 s[t,t2]),  l' = l * exp(m - m') + sum_t2 exp(s[t,t2] - m'),
//   o' = o * exp(m - m') + sum_t2 exp(s[t,t2] - m') v_t2
// and at the end out_t = o_t / l_t, lse_t = m_t + log l_t. Nothing of size T x T is stored.
//
// Backward (FlashAttention-2's): with P[t,t2] = exp(s[t,t2] - lse_t) recomputed from q, k
// and lse, dP[t,t2] = dout_t . v_t2 and D_t = dout_t . out_t (= sum_t2 P dP),
//   dS = P * (dP - D_t),  dv_t2 += P dout_t,  dk_t2 += scale dS q_t,  dq_t += scale dS k_t2.
// It walks key tiles and, inside one, every query row that sees it, so a tile's k, v, dk and
// dv stay in cache while the rows stream past.
//
// Threads: the forward splits (b, h, query tile), each owning its rows of out and lse; the
// backward splits (b, h), each owning its head's slice of dqkv (no two threads write one
// element, no atomics). Inner loops run over HS or over a tile's keys and vectorize.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "trainer/cpu/attention.hpp"

namespace tier::train {
namespace {

inline float dot(const float* a, const float* b, int n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[n] += a * x[n]
inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int tiles_q = (T + kFlashTileQ - 1) / kFlashTileQ;
  // Query tile i meets i + 1 key tiles (with equal tile sizes): dynamic, to balance the triangle.
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int qt = 0; qt < tiles_q; ++qt) {
        const int q0 = qt * kFlashTileQ, q1 = std::min(T, q0 + kFlashTileQ);
        const float* qkv_b = qkv + static_cast<long>(b) * T * C3;  // [T,3C] of sequence b
        float m[kFlashTileQ], l[kFlashTileQ];                      // running max and sum per row
        float s[kFlashTileK];                                      // one row's scores, then weights
        for (int t = q0; t < q1; ++t) {
          m[t - q0] = -INFINITY;
          l[t - q0] = 0;
          std::memset(out + (static_cast<long>(b) * T + t) * C + h * HS, 0, sizeof(float) * HS);
        }
        // Key tiles up to the tile's last query: later keys are masked for every row.
        for (int k0 = 0; k0 < q1; k0 += kFlashTileK) {
          const int k1 = std::min(q1, k0 + kFlashTileK);
          for (int t = std::max(q0, k0); t < q1; ++t) {  // rows before k0 see no key of this tile
            const int kend = std::min(k1, t + 1), n = kend - k0;
            const float* q = qkv_b + static_cast<long>(t) * C3 + h * HS;
            float smax = -INFINITY;
            for (int j = 0; j < n; ++j) {
              s[j] = scale * dot(q, qkv_b + static_cast<long>(k0 + j) * C3 + C + h * HS, HS);
              smax = std::max(smax, s[j]);
            }
            const int r = t - q0;
            const float m_new = std::max(m[r], smax);
            const float corr = std::exp(m[r] - m_new);  // 0 on the row's first tile (m = -inf)
            float sum = 0;
            for (int j = 0; j < n; ++j) {
              s[j] = std::exp(s[j] - m_new);
              sum += s[j];
            }
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            float* o = out + (static_cast<long>(b) * T + t) * C + h * HS;
#pragma omp simd
            for (int i = 0; i < HS; ++i) o[i] *= corr;
            for (int j = 0; j < n; ++j)
              axpy(o, s[j], qkv_b + static_cast<long>(k0 + j) * C3 + 2 * C + h * HS, HS);
          }
        }
        for (int t = q0; t < q1; ++t) {
          const int r = t - q0;
          float* o = out + (static_cast<long>(b) * T + t) * C + h * HS;
          const float inv = 1.0f / l[r];
#pragma omp simd
          for (int i = 0; i < HS; ++i) o[i] *= inv;
          lse[(static_cast<long>(b) * NH + h) * T + t] = m[r] + std::log(l[r]);
        }
      }
}

void attention_backward_flash(float* dqkv, float* drow, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const long bT = static_cast<long>(b) * T;
      const float* qkv_b = qkv + bT * C3;  // [T,3C]
      float* dqkv_b = dqkv + bT * C3;      // [T,3C]; this thread owns head h's columns
      const float* lse_bh = lse + (static_cast<long>(b) * NH + h) * T;  // [T]
      float* D = drow + (static_cast<long>(b) * NH + h) * T;            // [T]
      for (int t = 0; t < T; ++t) {
        const long i = (bT + t) * C + h * HS;
        D[t] = dot(dout + i, out + i, HS);
        float* dq = dqkv_b + static_cast<long>(t) * C3 + h * HS;
        std::memset(dq, 0, sizeof(float) * HS);          // dq
        std::memset(dq + C, 0, sizeof(float) * HS);      // dk
        std::memset(dq + 2 * C, 0, sizeof(float) * HS);  // dv
      }
      float p[kFlashTileK], ds[kFlashTileK];  // one row's P and scale * dS over the tile
      for (int k0 = 0; k0 < T; k0 += kFlashTileK) {
        const int k1 = std::min(T, k0 + kFlashTileK);
        for (int t = k0; t < T; ++t) {  // queries before k0 see no key of this tile
          const int n = std::min(k1, t + 1) - k0;
          const float* q = qkv_b + static_cast<long>(t) * C3 + h * HS;
          const float* g = dout + (bT + t) * C + h * HS;  // dout_t
          float* dq = dqkv_b + static_cast<long>(t) * C3 + h * HS;
          for (int j = 0; j < n; ++j) {
            const float* kv = qkv_b + static_cast<long>(k0 + j) * C3 + h * HS;  // + C: k, + 2C: v
            p[j] = scale * dot(q, kv + C, HS);
            ds[j] = dot(g, kv + 2 * C, HS);  // dP
          }
          const float l = lse_bh[t], Dt = D[t];
#pragma omp simd
          for (int j = 0; j < n; ++j) {
            p[j] = std::exp(p[j] - l);
            ds[j] = scale * p[j] * (ds[j] - Dt);
          }
          for (int j = 0; j < n; ++j) {
            const float* kv = qkv_b + static_cast<long>(k0 + j) * C3 + h * HS;
            float* dkv = dqkv_b + static_cast<long>(k0 + j) * C3 + h * HS;
            axpy(dkv + 2 * C, p[j], g, HS);  // dv
            axpy(dkv + C, ds[j], q, HS);     // dk
            axpy(dq, ds[j], kv + C, HS);     // dq
          }
        }
      }
    }
}

}  // namespace tier::train
