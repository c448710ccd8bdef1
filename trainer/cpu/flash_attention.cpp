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
// element, no atomics). Inner loops run over HS and vectorize; dot products and updates take
// four keys per pass (dot4, axpys), so each pass loads the row they share once.
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

// out[0..4) = a . r[0..4): four independent sums in one pass over a (one load of a per four
// products, four dependency chains instead of one).
inline void dot4(const float* a, const float* const r[4], int n, float* out) {
  const float *r0 = r[0], *r1 = r[1], *r2 = r[2], *r3 = r[3];
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int i = 0; i < n; ++i) {
    s0 += a[i] * r0[i];
    s1 += a[i] * r1[i];
    s2 += a[i] * r2[i];
    s3 += a[i] * r3[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

// out[j] = a . row(j) for j in [0, n), row(j) = base + j * stride.
inline void dots(const float* a, const float* base, long stride, int n, int len, float* out) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* r[4] = {base + j * stride, base + (j + 1) * stride, base + (j + 2) * stride,
                         base + (j + 3) * stride};
    dot4(a, r, len, out + j);
  }
  for (; j < n; ++j) out[j] = dot(a, base + j * stride, len);
}

// y[len] += sum_j w[j] * row(j) over j in [0, n), row(j) = base + j * stride: y is loaded and
// stored once per four rows.
inline void axpys(float* y, const float* w, const float* base, long stride, int n, int len) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *r0 = base + j * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
    const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
#pragma omp simd
    for (int i = 0; i < len; ++i) y[i] += w0 * r0[i] + w1 * r1[i] + w2 * r2[i] + w3 * r3[i];
  }
  for (; j < n; ++j) {
    const float* r = base + j * stride;
    const float wj = w[j];
#pragma omp simd
    for (int i = 0; i < len; ++i) y[i] += wj * r[i];
  }
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
            dots(q, qkv_b + static_cast<long>(k0) * C3 + C + h * HS, C3, n, HS, s);
            float smax = -INFINITY;
            for (int j = 0; j < n; ++j) {
              s[j] *= scale;
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
            axpys(o, s, qkv_b + static_cast<long>(k0) * C3 + 2 * C + h * HS, C3, n, HS);
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
      constexpr int kRows = 4;                              // query rows per pass over a key tile's dk and dv
      float p[kRows][kFlashTileK], ds[kRows][kFlashTileK];  // P and scale * dS of the rows
      for (int k0 = 0; k0 < T; k0 += kFlashTileK) {
        const int k1 = std::min(T, k0 + kFlashTileK);
        const float* kt = qkv_b + static_cast<long>(k0) * C3 + C + h * HS;  // k of key k0; + C: its v
        for (int t0 = k0; t0 < T; t0 += kRows) {  // queries before k0 see no key of this tile
          const int rows = std::min(kRows, T - t0);
          const int n_all = std::min(k1, t0 + rows) - k0;  // keys the group's last row sees
          const float *q[kRows], *g[kRows];
          for (int r = 0; r < kRows; ++r) {
            // Rows past T repeat row t0 with zero weights, so the loops below need no branch.
            const int t = t0 + (r < rows ? r : 0);
            q[r] = qkv_b + static_cast<long>(t) * C3 + h * HS;
            g[r] = dout + (bT + t) * C + h * HS;  // dout_t
            const int n = r < rows ? std::min(k1, t + 1) - k0 : 0;
            dots(q[r], kt, C3, n, HS, p[r]);       // q . k
            dots(g[r], kt + C, C3, n, HS, ds[r]);  // dP = dout . v
            const float l = lse_bh[t], Dt = D[t];
#pragma omp simd
            for (int j = 0; j < n; ++j) {
              p[r][j] = std::exp(scale * p[r][j] - l);
              ds[r][j] = scale * p[r][j] * (ds[r][j] - Dt);
            }
            for (int j = n; j < n_all; ++j) p[r][j] = ds[r][j] = 0;  // masked: key after t
            if (r < rows) axpys(dqkv_b + static_cast<long>(t) * C3 + h * HS, ds[r], kt, C3, n, HS);  // dq
          }
          // dk_j += sum_r scale dS[r,j] q_r and dv_j += sum_r P[r,j] dout_r: one load and store of
          // dk_j and dv_j per kRows rows.
          for (int j = 0; j < n_all; ++j) {
            float* dk = dqkv_b + static_cast<long>(k0 + j) * C3 + C + h * HS;  // + C: dv
            const float p0 = p[0][j], p1 = p[1][j], p2 = p[2][j], p3 = p[3][j];
            const float s0 = ds[0][j], s1 = ds[1][j], s2 = ds[2][j], s3 = ds[3][j];
            const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
            const float *g0 = g[0], *g1 = g[1], *g2 = g[2], *g3 = g[3];
#pragma omp simd
            for (int i = 0; i < HS; ++i) {
              dk[C + i] += p0 * g0[i] + p1 * g1[i] + p2 * g2[i] + p3 * g3[i];  // dv
              dk[i] += s0 * q0[i] + s1 * q1[i] + s2 * q2[i] + s3 * q3[i];      // dk
            }
          }
        }
      }
    }
}

}  // namespace tier::train
