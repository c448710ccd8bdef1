// The AdamW element loop in explicit AVX-512 / AVX2 (private to trainer/optimizer.cpp, which
// includes it by its bare name like chunked_simd.hpp).
//
// Why explicit: a step over a shard much larger than the caches is bound by memory traffic,
// and an out-of-place step (the double buffer: read buffer A, write buffer B) writes lines it
// never read. Ordinary stores then read each written line first (write-allocate): 12 extra
// bytes a parameter on top of the 28 that the step must move. Streaming (non-temporal) stores
// write whole lines without that read, so an out-of-place step moves what an in-place one
// does. The compiler does not emit them on its own, hence intrinsics.
//
// Arithmetic: per element exactly TT_ADAMW_ELEMENT's in optimizer.cpp (the same operations in
// the same order, IEEE multiply, add, divide and square root, no contraction), so a lane gives
// the bits of the scalar loop and the result depends on neither the ISA nor where a vector
// body or a remainder begins.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/optimizer.hpp"

namespace tier::train::simd {

// One call's buffers. p, m, v, g (or g16 for a bf16 gradient) are read; p_out, m_out, v_out are
// written (they may be p, m, v themselves); p_copy (fp32) and w_out (bf16 bits) are optional
// extra copies of the new parameter (null: none).
struct AdamWArgs {
  const float *p = nullptr, *m = nullptr, *v = nullptr, *g = nullptr;
  const uint16_t* g16 = nullptr;
  float *p_out = nullptr, *m_out = nullptr, *v_out = nullptr, *p_copy = nullptr;
  uint16_t* w_out = nullptr;
};

// The scalars of one step's element update (optimizer.cpp's TT_ADAMW_ELEMENT): gradient scale,
// betas, eps, rc2 = 1 / sqrt(bias2), keep = 1 - lr * wd (1 where no decay applies) and
// step = lr / bias1.
struct AdamWConsts {
  float gs, b1, b2, eps, rc2, keep, step;
};
// Those of step `s` with weight decay `wd` (0 where it does not apply).
AdamWConsts consts_of(const AdamWStep& s, float wd);

// Which explicit path this CPU takes: 2 = AVX-512 (F, BW, VL), 1 = AVX2, 0 = none (the caller
// runs its generic loop).
int simd_level();

// Elements [lo, hi) of `a` with streaming stores when `stream` (every non-null output 64-byte
// aligned and none aliasing an input; the caller checks), ordinary stores otherwise. Requires
// simd_level() > 0. Issues no fence: the caller fences once after all chunks.
void update_range(const AdamWArgs& a, const AdamWConsts& k, size_t lo, size_t hi, bool stream);

// c[i] = a[i] + s * b[i] for [lo, hi) with streaming stores where c is 64-byte aligned: the
// STREAM triad, the bandwidth probe the AdamW benchmarks measure against. Requires
// simd_level() > 0; no fence.
void triad_range(const float* a, const float* b, float* c, float s, size_t lo, size_t hi);

// The store fence that orders streaming stores before what follows (the commit record).
void stream_fence();

}  // namespace tier::train::simd
