// bfloat16 (bf16): the upper 16 bits of an IEEE-754 binary32 (1 sign, 8 exponent, 7 mantissa
// bits), the storage type of --precision bf16's working parameters and gradients.
//
// A bf16 value is a uint16_t holding those bits (no arithmetic type: every computation widens
// to fp32 first, which is exact). fp32 -> bf16 rounds to nearest, ties to even, in integer
// arithmetic, so the result does not depend on the FPU's modes: denormals round like any other
// value (no flush to zero), finite values past the largest bf16 round to +-inf, and a NaN stays
// a NaN (quieted; sign and upper payload kept). torch's `.bfloat16()` gives the same bits for
// every non-NaN input (it returns 0x7fc0 for every NaN).
//
// Thread-safety: pure functions. The bulk conversions split long arrays over OpenMP threads.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace tier::train {

using bf16_t = uint16_t;  // the bits of one bf16 value

// Round to nearest even; NaN -> quiet NaN of the same sign.
inline bf16_t bf16_from_f32(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x0040u);
  return static_cast<bf16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Exact.
inline float bf16_to_f32(bf16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Bulk conversions of n values (vectorized; src and dst must not overlap).
void f32_to_bf16(const float* src, bf16_t* dst, size_t n);
void bf16_to_f32(const bf16_t* src, float* dst, size_t n);

// Sum of squares in double of n bf16 values (the global gradient norm of a bf16 gradient).
double sum_squares_bf16(const bf16_t* g, size_t n);

// out[i] = bf16(chunks[0][i] + chunks[1][i] + ... + chunks[R-1][i]) for i < count, where
// chunks[r] = chunks + r * count: each sum accumulated in fp32 in rank order 0..R-1 and rounded
// once. The second half of the bf16 reduce-scatter (trainer/comm.hpp), so its result depends
// on neither MPI's reduction algorithm nor the thread count.
void sum_chunks_bf16(const bf16_t* chunks, int ranks, size_t count, bf16_t* out);

}  // namespace tier::train
