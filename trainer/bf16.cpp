#include "trainer/bf16.hpp"

#include "chunked_simd.hpp"

namespace tier::train {

namespace {

// Per OpenMP task: large enough to amortize the fork. The loops are written for the compiler
// to vectorize (the NaN test becomes a select).
constexpr size_t kChunk = 1 << 15;

#define TT_BF16_LOOP(body) TT_CHUNKED_SIMD(n, kChunk, body)

__attribute__((target("avx2"))) void to_bf16_avx2(const float* src, bf16_t* dst, size_t n) {
  TT_BF16_LOOP(dst[i] = bf16_from_f32(src[i]))
}
void to_bf16_generic(const float* src, bf16_t* dst, size_t n) { TT_BF16_LOOP(dst[i] = bf16_from_f32(src[i])) }
__attribute__((target("avx2"))) void to_f32_avx2(const bf16_t* src, float* dst, size_t n) {
  TT_BF16_LOOP(dst[i] = bf16_to_f32(src[i]))
}
void to_f32_generic(const bf16_t* src, float* dst, size_t n) { TT_BF16_LOOP(dst[i] = bf16_to_f32(src[i])) }

}  // namespace

void f32_to_bf16(const float* src, bf16_t* dst, size_t n) {
  if (have_avx2()) to_bf16_avx2(src, dst, n);
  else to_bf16_generic(src, dst, n);
}

void bf16_to_f32(const bf16_t* src, float* dst, size_t n) {
  if (have_avx2()) to_f32_avx2(src, dst, n);
  else to_f32_generic(src, dst, n);
}

// sum_squares_bf16: trainer/optimizer.cpp, beside the fp32 sum it shares its loop with.

void sum_chunks_bf16(const bf16_t* chunks, int ranks, size_t count, bf16_t* out) {
  const size_t n = count;
  TT_BF16_LOOP({
    float s = bf16_to_f32(chunks[i]);
    for (int r = 1; r < ranks; ++r) s += bf16_to_f32(chunks[static_cast<size_t>(r) * count + i]);
    out[i] = bf16_from_f32(s);
  })
}

}  // namespace tier::train
