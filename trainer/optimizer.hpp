// AdamW over one shard, the learning-rate schedule and the gradient-norm helper.
//
// adamw_update is vectorized (AVX-512 or AVX2 when the CPU has it, chosen at run time; the
// build needs no -march flag) and multi-threaded with OpenMP over chunks of the shard. An
// out-of-place update of a large shard (the double buffer) writes with streaming stores, so it
// moves the bytes of an in-place one (trainer/adamw_simd.hpp says why). It is compiled
// without floating-point contraction so that every element gets bit-identical arithmetic
// whether it falls in a vector body or a remainder loop: the same seed then gives the same
// parameters whatever the shard boundaries (rank count) are.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tier::train {

struct AdamWConfig {
  float lr = 4e-4f;  // tier-train's default --lr (docs/trainer.md, the loss spikes)
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// What one step needs beyond the config: the scheduled lr, the step number t (1-based) for
// bias correction, and the clip factor applied to every gradient.
struct AdamWStep {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float bias1 = 1, bias2 = 1;  // 1 - beta1^t, 1 - beta2^t
  float grad_scale = 1;
};
AdamWStep make_step(const AdamWConfig& c, float lr, int64_t t, float grad_scale);

// One AdamW step on n elements. Inputs p, m, v (old) and g; outputs p_out, m_out, v_out, which
// may be the same arrays as the inputs (in place) or other buffers (double buffering). `decay`
// says whether weight decay applies to these elements. p_copy, when not null, receives the new
// parameters too, in the same pass (OffloadAdamW's model parameter beside its master row).
// Returns after every store is visible to other threads and processes.
void adamw_update(const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out,
                  float* v_out, size_t n, const AdamWStep& s, bool decay, float* p_copy = nullptr);
// The baseline: the same math as a plain scalar single-threaded loop.
void adamw_update_scalar(const float* p, const float* m, const float* v, const float* g, float* p_out,
                         float* m_out, float* v_out, size_t n, const AdamWStep& s, bool decay);
// --precision bf16: the same step on the fp32 master params p, m, v and the bf16 gradient g
// (trainer/bf16.hpp bits), writing p_out, m_out, v_out (fp32; may alias the inputs) and the
// new bf16 working copy w_out = bf16(p_out) in the same pass. Per element the arithmetic of
// adamw_update with g widened exactly, so it is as bit-identical whatever the shard boundaries.
void adamw_update_bf16(const float* p, const float* m, const float* v, const uint16_t* g, float* p_out,
                       float* m_out, float* v_out, uint16_t* w_out, size_t n, const AdamWStep& s, bool decay);
// One piece of a batched update (adamw_update_many): adamw_update's arguments, p_copy optional;
// or, with g16 (a bf16 gradient) instead of g, adamw_update_bf16's, w_out optional.
struct AdamWJob {
  const float *p, *m, *v, *g;
  float *p_out, *m_out, *v_out, *p_copy;
  size_t n;
  AdamWStep step;
  bool decay;
  const uint16_t* g16 = nullptr;
  uint16_t* w_out = nullptr;
};
// adamw_update of every job, in one OpenMP parallel region over all their chunks (per element
// the same bits): a step over many parameters forks and joins the threads once, not once per
// parameter (each join waits for the slowest thread, a descheduled one on a shared machine).
void adamw_update_many(const AdamWJob* jobs, size_t count);

// The bandwidth probe of the AdamW benchmarks: c[i] = a[i] + s * b[i] (the STREAM triad) over
// OpenMP threads, with the streaming stores adamw_update uses where c is 64-byte aligned, so it
// moves 12 bytes an element and no more. Vectorized like adamw_update.
void stream_triad(const float* a, const float* b, float* c, float s, size_t n);
// Which code path adamw_update takes on this CPU: "avx512", "avx2" or "generic".
const char* adamw_isa();

// Sum of squares in double (for the global gradient norm), multi-threaded.
double sum_squares(const float* g, size_t n);

// Linear warmup over `warmup` steps, then cosine decay to min_lr_frac * lr at `total`.
float lr_at(float lr, int64_t step, int64_t warmup, int64_t total, float min_lr_frac = 0.1f);

// The warmup of a `total`-step run without --warmup: a tenth of the run, but at least
// min(100, total / 2) steps, and at least 1. A short run warms up over half its steps, a long
// one over 100 (or a tenth past 1000 steps). docs/trainer.md says why.
int64_t default_warmup(int64_t total);

}  // namespace tier::train
