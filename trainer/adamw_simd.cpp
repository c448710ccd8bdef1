// The AdamW element loop in explicit AVX-512 / AVX2: see adamw_simd.hpp. Compiled with
// -ffp-contract=off (trainer/CMakeLists.txt) like optimizer.cpp.
#include "adamw_simd.hpp"

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "trainer/bf16.hpp"

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() inside
// the widening intrinsics (a self-initialized placeholder, not a read of anything).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tier::train::simd {
namespace {

#define TT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline
#define TT_AVX2 __attribute__((target("avx2"), always_inline)) static inline

// The operations one ISA offers the loop below: W lanes of fp32 (V) and of int32 (I).
struct Avx512 {
  using V = __m512;
  using I = __m512i;
  static constexpr size_t W = 16;
  TT_AVX512 V set(float x) { return _mm512_set1_ps(x); }
  TT_AVX512 V load(const float* p) { return _mm512_loadu_ps(p); }
  TT_AVX512 V add(V a, V b) { return _mm512_add_ps(a, b); }
  TT_AVX512 V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  TT_AVX512 V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  TT_AVX512 V div(V a, V b) { return _mm512_div_ps(a, b); }
  TT_AVX512 V sqrt(V a) { return _mm512_sqrt_ps(a); }
  TT_AVX512 void store(float* p, V x, bool stream) {
    if (stream) _mm512_stream_ps(p, x);
    else _mm512_storeu_ps(p, x);
  }
  // bf16 bits (W of them) widened to fp32, exactly.
  TT_AVX512 V load_bf16(const uint16_t* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  // bf16_from_f32 of every lane, stored as W uint16.
  TT_AVX512 void store_bf16(uint16_t* p, V x, bool stream) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rne =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    const __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rne, qnan));
    if (stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
};

struct Avx2 {
  using V = __m256;
  static constexpr size_t W = 8;
  TT_AVX2 V set(float x) { return _mm256_set1_ps(x); }
  TT_AVX2 V load(const float* p) { return _mm256_loadu_ps(p); }
  TT_AVX2 V add(V a, V b) { return _mm256_add_ps(a, b); }
  TT_AVX2 V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  TT_AVX2 V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  TT_AVX2 V div(V a, V b) { return _mm256_div_ps(a, b); }
  TT_AVX2 V sqrt(V a) { return _mm256_sqrt_ps(a); }
  TT_AVX2 void store(float* p, V x, bool stream) {
    if (stream) _mm256_stream_ps(p, x);
    else _mm256_storeu_ps(p, x);
  }
  TT_AVX2 V load_bf16(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  TT_AVX2 void store_bf16(uint16_t* p, V x, bool stream) {
    const __m256i u = _mm256_castps_si256(x);
    // |u| > 0x7f800000 as signed compare: both sides are below 2^31.
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rne =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    const __m256i r = _mm256_blendv_epi8(rne, qnan, nan);  // every lane < 2^16: packus is exact
    const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
    if (stream) _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
};

// One element with TT_ADAMW_ELEMENT's arithmetic (optimizer.cpp), for the remainder.
inline void element(const AdamWArgs& a, const AdamWConsts& k, size_t i) {
  const float gi = (a.g16 != nullptr ? bf16_to_f32(a.g16[i]) : a.g[i]) * k.gs;
  const float mi = k.b1 * a.m[i] + (1.0f - k.b1) * gi;
  const float vi = k.b2 * a.v[i] + (1.0f - k.b2) * gi * gi;
  const float denom = std::sqrt(vi) * k.rc2 + k.eps;
  const float po = a.p[i] * k.keep - k.step * (mi / denom);
  a.p_out[i] = po;
  a.m_out[i] = mi;
  a.v_out[i] = vi;
  if (a.p_copy != nullptr) a.p_copy[i] = po;
  if (a.w_out != nullptr) a.w_out[i] = bf16_from_f32(po);
}

// The vector body over [lo, lo + W * floor((hi - lo) / W)) for ISA S, then the remainder element
// by element; BF16G: the gradient is g16. A macro, not a template: GCC inlines the ISA's
// target-specific operations only into a function of that target.
#define TT_SIMD_BODY(S, BF16G)                                                                          \
  {                                                                                                     \
    using V = S::V;                                                                                     \
    const V gs = S::set(k.gs), b1 = S::set(k.b1), nb1 = S::set(1.0f - k.b1), b2 = S::set(k.b2),         \
            nb2 = S::set(1.0f - k.b2), rc2 = S::set(k.rc2), eps = S::set(k.eps), keep = S::set(k.keep), \
            step = S::set(k.step);                                                                      \
    size_t i = lo;                                                                                      \
    for (; i + S::W <= hi; i += S::W) {                                                                 \
      const V gi = S::mul((BF16G) ? S::load_bf16(a.g16 + i) : S::load(a.g + i), gs);                    \
      const V mi = S::add(S::mul(b1, S::load(a.m + i)), S::mul(nb1, gi));                               \
      const V vi = S::add(S::mul(b2, S::load(a.v + i)), S::mul(S::mul(nb2, gi), gi));                   \
      const V denom = S::add(S::mul(S::sqrt(vi), rc2), eps);                                            \
      const V po = S::sub(S::mul(S::load(a.p + i), keep), S::mul(step, S::div(mi, denom)));             \
      S::store(a.p_out + i, po, stream);                                                                \
      S::store(a.m_out + i, mi, stream);                                                                \
      S::store(a.v_out + i, vi, stream);                                                                \
      if (a.p_copy != nullptr) S::store(a.p_copy + i, po, stream);                                      \
      if (a.w_out != nullptr) S::store_bf16(a.w_out + i, po, stream);                                   \
    }                                                                                                   \
    for (; i < hi; ++i) element(a, k, i);                                                               \
  }

__attribute__((target("avx512f,avx512bw,avx512vl"))) void range_avx512(const AdamWArgs& a,
                                                                       const AdamWConsts& k, size_t lo,
                                                                       size_t hi, bool stream) {
  if (a.g16 != nullptr) TT_SIMD_BODY(Avx512, true)
  else TT_SIMD_BODY(Avx512, false)
}

__attribute__((target("avx2"))) void range_avx2(const AdamWArgs& a, const AdamWConsts& k, size_t lo,
                                                size_t hi, bool stream) {
  if (a.g16 != nullptr) TT_SIMD_BODY(Avx2, true)
  else TT_SIMD_BODY(Avx2, false)
}

#define TT_TRIAD_BODY(S)                                                           \
  {                                                                                \
    const bool stream = reinterpret_cast<uintptr_t>(c + lo) % (S::W * 4) == 0;     \
    const S::V sv = S::set(s);                                                     \
    size_t i = lo;                                                                 \
    for (; i + S::W <= hi; i += S::W)                                              \
      S::store(c + i, S::add(S::load(a + i), S::mul(sv, S::load(b + i))), stream); \
    for (; i < hi; ++i) c[i] = a[i] + s * b[i];                                    \
  }

__attribute__((target("avx512f,avx512bw,avx512vl"))) void triad_avx512(const float* a, const float* b,
                                                                       float* c, float s, size_t lo,
                                                                       size_t hi) {
  TT_TRIAD_BODY(Avx512)
}

__attribute__((target("avx2"))) void triad_avx2(const float* a, const float* b, float* c, float s, size_t lo,
                                                size_t hi) {
  TT_TRIAD_BODY(Avx2)
}

}  // namespace

AdamWConsts consts_of(const AdamWStep& s, float wd) {
  return {.gs = s.grad_scale,
          .b1 = s.beta1,
          .b2 = s.beta2,
          .eps = s.eps,
          .rc2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.bias2))),
          .keep = 1.0f - s.lr * wd,
          .step = s.lr / s.bias1};
}

int simd_level() {
  static const int level = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      return 2;
    return __builtin_cpu_supports("avx2") ? 1 : 0;
  }();
  return level;
}

void update_range(const AdamWArgs& a, const AdamWConsts& k, size_t lo, size_t hi, bool stream) {
  if (simd_level() == 2) range_avx512(a, k, lo, hi, stream);
  else range_avx2(a, k, lo, hi, stream);
}

void triad_range(const float* a, const float* b, float* c, float s, size_t lo, size_t hi) {
  if (simd_level() == 2) triad_avx512(a, b, c, s, lo, hi);
  else triad_avx2(a, b, c, s, lo, hi);
}

void stream_fence() { _mm_sfence(); }

}  // namespace tier::train::simd
