// The loop of tier-train's elementwise CPU kernels (AdamW, bf16 conversions): [0, n) in chunks
// of `chunk` elements spread over OpenMP threads, each chunk one `omp simd` loop running
// `stmt` for index `i`. A kernel is compiled twice, once in a target("avx2") function and once
// in a generic one, and have_avx2() picks at run time: the build needs no -march flag.
//
// Private to trainer/ (optimizer.cpp and bf16.cpp include it by its bare name); `stmt` may use any name but
// the loop's own tt_chunks_, tt_c_, tt_lo_, tt_hi_.
#pragma once

#include <cstddef>

#define TT_CHUNKED_SIMD(n, chunk, stmt)                                                                     \
  const long tt_chunks_ = static_cast<long>(((n) + (chunk) - 1) / (chunk));                                 \
  _Pragma("omp parallel for schedule(static) if (tt_chunks_ > 1)") for (long tt_c_ = 0; tt_c_ < tt_chunks_; \
                                                                        ++tt_c_) {                          \
    const size_t tt_lo_ = static_cast<size_t>(tt_c_) * (chunk);                                             \
    const size_t tt_hi_ = tt_lo_ + (chunk) < (n) ? tt_lo_ + (chunk) : (n);                                  \
    _Pragma("omp simd") for (size_t i = tt_lo_; i < tt_hi_; ++i) stmt;                                      \
  }

namespace tier::train {

// Whether this CPU (and its OS) runs AVX2 code; asked once.
inline bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

}  // namespace tier::train
