#include "trainer/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "adamw_simd.hpp"
#include "trainer/bf16.hpp"
#include "chunked_simd.hpp"

namespace tier::train {

AdamWStep make_step(const AdamWConfig& c, float lr, int64_t t, float grad_scale) {
  AdamWStep s;
  s.lr = lr;
  s.beta1 = c.beta1;
  s.beta2 = c.beta2;
  s.eps = c.eps;
  s.weight_decay = c.weight_decay;
  s.bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t)));
  s.bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t)));
  s.grad_scale = grad_scale;
  return s;
}

namespace {

// The element update, shared by every path (fp32 and bf16). Written so that the compiler
// vectorizes it. GRAD is element i's fp32 gradient; AFTER runs last, with the new weight `po`.
// torch.optim.AdamW's order, p * (1 - lr wd) - (lr / bias1) * m / (sqrt(v) / sqrt(bias2) + eps),
// except that 1 / sqrt(bias2) is a constant of the step (a multiply): an element costs one
// square root and one division (the divider bounds the loop when the cores are shared).
#define TT_ADAMW_ELEMENT(i, GRAD, AFTER)                \
  {                                                     \
    const float gi = (GRAD) * gs;                       \
    const float mi = b1 * m[i] + (1.0f - b1) * gi;      \
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi; \
    const float denom = std::sqrt(vi) * rc2 + eps;      \
    const float po = p[i] * keep - step * (mi / denom); \
    p_out[i] = po;                                      \
    m_out[i] = mi;                                      \
    v_out[i] = vi;                                      \
    AFTER;                                              \
  }
#define TT_ADAMW_BODY(i) TT_ADAMW_ELEMENT(i, g[i], (void)0)
// The step's scalars as locals (simd::consts_of): the outputs may alias nothing the compiler
// can prove, so reading them through a struct inside the loop would block vectorization.
#define TT_ADAMW_LOCALS                                \
  const simd::AdamWConsts k_ = simd::consts_of(s, wd); \
  const float gs = k_.gs, b1 = k_.b1, b2 = k_.b2, rc2 = k_.rc2, eps = k_.eps, keep = k_.keep, step = k_.step

// Chunk size per OpenMP task: large enough to amortize the fork, small enough to balance.
constexpr size_t kChunk = 1 << 14;

// The whole update over [0, n) (trainer/chunked_simd.hpp): the loop of a CPU without AVX2 (the
// others take the explicit loop of adamw_simd.hpp, per element the same arithmetic).
#define TT_ADAMW_CHUNKS(BODY) \
  TT_ADAMW_LOCALS;            \
  TT_CHUNKED_SIMD(n, kChunk, BODY(i))
#define TT_ADAMW_LOOP TT_ADAMW_CHUNKS(TT_ADAMW_BODY)

void update_generic(const float* p, const float* m, const float* v, const float* g, float* p_out,
                    float* m_out, float* v_out, size_t n, const AdamWStep& s, float wd) {
  TT_ADAMW_LOOP
}

// bf16: the gradient widened (exactly), the fp32 update, and the rounded working copy.
#define TT_ADAMW_BF16_BODY(i) TT_ADAMW_ELEMENT(i, bf16_to_f32(g[i]), w_out[i] = bf16_from_f32(po))
#define TT_ADAMW_BF16_LOOP TT_ADAMW_CHUNKS(TT_ADAMW_BF16_BODY)

void update_bf16_generic(const float* p, const float* m, const float* v, const uint16_t* g, float* p_out,
                         float* m_out, float* v_out, uint16_t* w_out, size_t n, const AdamWStep& s,
                         float wd) {
  TT_ADAMW_BF16_LOOP
}

}  // namespace

namespace {

// Streaming stores pay off only when the outputs are far larger than the caches (below that,
// the next reader finds ordinary stores still cached) and cannot be used in place (a line
// just read is already cached: no write-allocate to save) or on a misaligned output.
constexpr size_t kStreamMin = size_t{1} << 20;  // elements: 4 MiB a row

bool aligned64(const void* q) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % 64 == 0; }

bool use_streaming(const simd::AdamWArgs& a, size_t n) {
  if (n < kStreamMin || a.p_out == a.p || a.m_out == a.m || a.v_out == a.v) return false;
  return aligned64(a.p_out) && aligned64(a.m_out) && aligned64(a.v_out) && aligned64(a.p_copy) &&
         aligned64(a.w_out);
}

// The explicit-SIMD update (adamw_simd.hpp) in kChunk chunks over OpenMP threads; each thread
// fences its streaming stores before the parallel region ends.
void update_simd(const simd::AdamWArgs& a, size_t n, const AdamWStep& s, float wd) {
  const simd::AdamWConsts k = simd::consts_of(s, wd);
  const bool stream = use_streaming(a, n);
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
#pragma omp parallel if (chunks > 1)
  {
#pragma omp for schedule(static)
    for (long c = 0; c < chunks; ++c) {
      const size_t lo = static_cast<size_t>(c) * kChunk;
      simd::update_range(a, k, lo, std::min(n, lo + kChunk), stream);
    }
    if (stream) simd::stream_fence();
  }
}

}  // namespace

void adamw_update(const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out,
                  float* v_out, size_t n, const AdamWStep& s, bool decay, float* p_copy) {
  const float wd = decay ? s.weight_decay : 0.0f;
  if (simd::simd_level() > 0) {
    update_simd(
        {.p = p, .m = m, .v = v, .g = g, .p_out = p_out, .m_out = m_out, .v_out = v_out, .p_copy = p_copy}, n,
        s, wd);
    return;
  }
  update_generic(p, m, v, g, p_out, m_out, v_out, n, s, wd);
  if (p_copy != nullptr) std::copy(p_out, p_out + n, p_copy);
}

void adamw_update_many(const AdamWJob* jobs, size_t count) {
  if (simd::simd_level() == 0) {
    for (size_t j = 0; j < count; ++j) {
      const AdamWJob& b = jobs[j];
      if (b.g16 != nullptr)
        adamw_update_bf16(b.p, b.m, b.v, b.g16, b.p_out, b.m_out, b.v_out, b.w_out, b.n, b.step, b.decay);
      else adamw_update(b.p, b.m, b.v, b.g, b.p_out, b.m_out, b.v_out, b.n, b.step, b.decay, b.p_copy);
    }
    return;
  }
  struct Piece {
    simd::AdamWArgs a;
    simd::AdamWConsts k;
    size_t n;
    bool stream;
  };
  std::vector<Piece> pieces;
  std::vector<std::pair<size_t, size_t>> chunks;  // (piece, first element)
  bool any_stream = false;
  for (size_t j = 0; j < count; ++j) {
    const AdamWJob& b = jobs[j];
    const simd::AdamWArgs a{.p = b.p,
                            .m = b.m,
                            .v = b.v,
                            .g = b.g16 != nullptr ? nullptr : b.g,
                            .g16 = b.g16,
                            .p_out = b.p_out,
                            .m_out = b.m_out,
                            .v_out = b.v_out,
                            .p_copy = b.p_copy,
                            .w_out = b.w_out};
    pieces.push_back(
        {a, simd::consts_of(b.step, b.decay ? b.step.weight_decay : 0.0f), b.n, use_streaming(a, b.n)});
    any_stream = any_stream || pieces.back().stream;
    for (size_t lo = 0; lo < b.n; lo += kChunk) chunks.emplace_back(j, lo);
  }
  const long total = static_cast<long>(chunks.size());
#pragma omp parallel if (total > 1)
  {
#pragma omp for schedule(static)
    for (long c = 0; c < total; ++c) {
      const Piece& q = pieces[chunks[static_cast<size_t>(c)].first];
      const size_t lo = chunks[static_cast<size_t>(c)].second;
      simd::update_range(q.a, q.k, lo, std::min(q.n, lo + kChunk), q.stream);
    }
    if (any_stream) simd::stream_fence();
  }
}

void adamw_update_bf16(const float* p, const float* m, const float* v, const uint16_t* g, float* p_out,
                       float* m_out, float* v_out, uint16_t* w_out, size_t n, const AdamWStep& s,
                       bool decay) {
  const float wd = decay ? s.weight_decay : 0.0f;
  if (simd::simd_level() > 0) {
    update_simd(
        {.p = p, .m = m, .v = v, .g16 = g, .p_out = p_out, .m_out = m_out, .v_out = v_out, .w_out = w_out}, n,
        s, wd);
    return;
  }
  update_bf16_generic(p, m, v, g, p_out, m_out, v_out, w_out, n, s, wd);
}

__attribute__((optimize("no-tree-vectorize"))) void adamw_update_scalar(const float* p, const float* m,
                                                                        const float* v, const float* g,
                                                                        float* p_out, float* m_out,
                                                                        float* v_out, size_t n,
                                                                        const AdamWStep& s, bool decay) {
  const float wd = decay ? s.weight_decay : 0.0f;
  TT_ADAMW_LOCALS;
  for (size_t i = 0; i < n; ++i) TT_ADAMW_BODY(i)
}

void stream_triad(const float* a, const float* b, float* c, float s, size_t n) {
  if (simd::simd_level() == 0) {
    TT_CHUNKED_SIMD(n, kChunk, c[i] = a[i] + s * b[i]);
    return;
  }
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
#pragma omp parallel if (chunks > 1)
  {
#pragma omp for schedule(static)
    for (long ch = 0; ch < chunks; ++ch) {
      const size_t lo = static_cast<size_t>(ch) * kChunk;
      simd::triad_range(a, b, c, s, lo, std::min(n, lo + kChunk));
    }
    simd::stream_fence();
  }
}

const char* adamw_isa() {
  static constexpr const char* kNames[] = {"generic", "avx2", "avx512"};
  return kNames[simd::simd_level()];
}

namespace {

// The sum of squares in double: chunks across OpenMP threads, each summed alone, so the result
// depends only on n (not on the thread count). `widen` makes an element a double, exactly.
template <class T, class Widen> double chunked_sum_squares(const T* g, size_t n, Widen widen) {
  double total = 0;
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
#pragma omp parallel for reduction(+ : total) if (chunks > 1)
  for (long c = 0; c < chunks; ++c) {
    const size_t lo = static_cast<size_t>(c) * kChunk;
    const size_t hi = lo + kChunk < n ? lo + kChunk : n;
    double s = 0;
    for (size_t i = lo; i < hi; ++i) {
      const double x = widen(g[i]);
      s += x * x;
    }
    total += s;
  }
  return total;
}

}  // namespace

double sum_squares(const float* g, size_t n) {
  return chunked_sum_squares(g, n, [](float x) { return static_cast<double>(x); });
}

double sum_squares_bf16(const bf16_t* g, size_t n) {
  return chunked_sum_squares(g, n, [](bf16_t x) { return static_cast<double>(bf16_to_f32(x)); });
}

int64_t default_warmup(int64_t total) {
  return std::max<int64_t>({1, total / 10, std::min<int64_t>(100, total / 2)});
}

float lr_at(float lr, int64_t step, int64_t warmup, int64_t total, float min_lr_frac) {
  if (warmup > 0 && step <= warmup) return lr * static_cast<float>(step) / static_cast<float>(warmup);
  const int64_t span = total - warmup;
  if (span <= 0) return lr;
  double frac = static_cast<double>(step - warmup) / static_cast<double>(span);
  if (frac > 1.0) frac = 1.0;
  const double cosf = 0.5 * (1.0 + std::cos(M_PI * frac));
  return static_cast<float>(lr * (min_lr_frac + (1.0 - min_lr_frac) * cosf));
}

}  // namespace tier::train
