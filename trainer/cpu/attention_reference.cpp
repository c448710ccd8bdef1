// The materialized causal attention of the CPU backend (attention.hpp): the reference the
// tiled flash attention (flash_attention.inc) is tested against, and `--attention reference`.
#include <cmath>
#include <cstring>

#include "trainer/cpu/attention.hpp"

namespace tier::train {

// Causal self-attention. qkv[B,T,3C] -> out[B,T,C]; att[B,NH,T,T] saves the probabilities.
void attention_forward_reference(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int C3 = 3 * C;
#pragma omp parallel for collapse(3)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const float* q = qkv + (static_cast<long>(b) * T + t) * C3 + h * hs;
        float* a = att + ((static_cast<long>(b) * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (static_cast<long>(b) * T + t2) * C3 + C + h * hs;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          a[t2] = dot;
          if (dot > maxv) maxv = dot;
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0;
        float* o = out + (static_cast<long>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (static_cast<long>(b) * T + t2) * C3 + 2 * C + h * hs;
          const float p = a[t2];
#pragma omp simd
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
}

// dqkv[B,T,3C] (overwritten) from dout[B,T,C]; datt[B,NH,T,T] is scratch.
void attention_backward_reference(float* dqkv, float* datt, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int C3 = 3 * C;
  std::memset(dqkv, 0, sizeof(float) * static_cast<size_t>(B) * T * C3);
  // Parallel over (b, h): each pair owns its head's slice of dqkv, so no two threads write
  // the same element.
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const long row = static_cast<long>(b) * T + t;
        const float* a = att + ((static_cast<long>(b) * NH + h) * T + t) * T;
        float* da = datt + ((static_cast<long>(b) * NH + h) * T + t) * T;
        const float* g = dout + row * C + h * hs;
        // out = sum_t2 a[t2] v[t2]
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (static_cast<long>(b) * T + t2) * C3 + 2 * C + h * hs;
          float* dv = dqkv + (static_cast<long>(b) * T + t2) * C3 + 2 * C + h * hs;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) {
            dot += v[i] * g[i];
            dv[i] += a[t2] * g[i];
          }
          da[t2] = dot;
        }
        // softmax backward: dpre[t2] = a[t2] * (da[t2] - sum a * da)
        float s = 0;
        for (int t2 = 0; t2 <= t; ++t2) s += a[t2] * da[t2];
        const float* q = qkv + row * C3 + h * hs;
        float* dq = dqkv + row * C3 + h * hs;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float dpre = a[t2] * (da[t2] - s) * scale;
          const float* k = qkv + (static_cast<long>(b) * T + t2) * C3 + C + h * hs;
          float* dk = dqkv + (static_cast<long>(b) * T + t2) * C3 + C + h * hs;
#pragma omp simd
          for (int i = 0; i < hs; ++i) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
}

}  // namespace tier::train
