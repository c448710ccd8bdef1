// The CPU flash attention (trainer/cpu/flash_attention.inc) against the materialized reference
// (attention_reference.cpp): forward output and backward dqkv at GPT-2 head shapes, at
// sequence lengths that are and are not multiples of the tile, and at T = 1; and the block
// memory of the flash path, which must grow linearly in T.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer/backend.hpp"
#include "support/attention_check.hpp"
#include "trainer/cpu/attention.hpp"
#include "trainer/model.hpp"

using namespace tier::train;

namespace {

using tier::test::randn;
using tier::test::rel_err;

// fp32 flash vs fp32 reference: both round differently (the flash sums are rescaled tile by
// tile), so they agree to a few ulps of the largest value, far below this bound.
constexpr double kTol = 1e-5;

struct Shape {
  int B, NH, HS, T;
  float spread;  // std of q, k, v: 1 gives scores of std ~1, 3 gives peaked rows (std ~9)
};

}  // namespace

TEST_CASE("flash attention matches the reference attention, forward and backward", "[trainer][attention]") {
  const Shape shape = GENERATE(Shape{2, 6, 64, 256, 1.0f},  // GPT-2 heads, 4 whole tiles
                               Shape{2, 6, 64, 200, 1.0f},  // T not a multiple of the tile
                               Shape{1, 4, 32, 130, 3.0f},  // peaked softmax; a 2-row last tile
                               Shape{3, 2, 8, 1, 1.0f},     // T = 1: each row sees only itself
                               Shape{1, 3, 16, 64, 1.0f});  // exactly one tile
  const int B = shape.B, NH = shape.NH, T = shape.T, C = NH * shape.HS;
  INFO("B=" << B << " NH=" << NH << " HS=" << shape.HS << " T=" << T << " spread " << shape.spread);
  const size_t BT = size_t(B) * T, rows = size_t(B) * NH * T;
  const std::vector<float> qkv = randn(BT * 3 * C, 1, shape.spread);
  const std::vector<float> dout = randn(BT * C, 2, 1.0f);

  std::vector<float> out_ref(BT * C), att(rows * T), dqkv_ref(BT * 3 * C), datt(rows * T);
  attention_forward_reference(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_backward_reference(dqkv_ref.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                               NH);

  // Poisoned outputs: the flash kernels must overwrite every element.
  std::vector<float> out(BT * C, NAN), lse(rows, NAN), dqkv(BT * 3 * C, NAN), drow(rows, NAN);
  attention_forward_flash(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  attention_backward_flash(dqkv.data(), drow.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                           NH);

  const double e_out = rel_err(out, out_ref, C, 0, C);
  const double e_dq = rel_err(dqkv, dqkv_ref, 3 * C, 0, C);
  const double e_dk = rel_err(dqkv, dqkv_ref, 3 * C, C, C);
  const double e_dv = rel_err(dqkv, dqkv_ref, 3 * C, 2 * C, C);
  INFO("max abs error / max |reference|: out " << e_out << ", dq " << e_dq << ", dk " << e_dk << ", dv "
                                               << e_dv);
  CHECK(e_out <= kTol);
  CHECK(e_dq <= kTol);
  CHECK(e_dk <= kTol);
  CHECK(e_dv <= kTol);

  // lse is the log of the softmax denominator: exp(scale q.k - lse) must be the reference's
  // probabilities (checked on the diagonal, which every row has).
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.HS));
  double e_p = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv.data() + (size_t(b) * T + t) * 3 * C + h * shape.HS;
        double s = 0;
        for (int i = 0; i < shape.HS; ++i) s += double(q[i]) * q[C + i];
        const size_t row = (size_t(b) * NH + h) * T + t;
        e_p = std::max(e_p, std::abs(std::exp(scale * s - lse[row]) - att[row * T + t]));
      }
  INFO("max |P_tt - reference| " << e_p);
  CHECK(e_p <= kTol);
}

TEST_CASE("flash attention keeps a block's memory linear in T", "[trainer][attention]") {
  ModelConfig m;  // GPT-2 124M's block: C = 768, 12 heads
  m.layers = 12;
  m.dim = 768;
  m.heads = 12;
  m.seq = 2048;
  const Dims f1 = m.dims(1, 1024, Attention::kFlash), f2 = m.dims(1, 2048, Attention::kFlash);
  const Dims r1 = m.dims(1, 1024, Attention::kReference), r2 = m.dims(1, 2048, Attention::kReference);
  const double acts_ratio = double(block_acts_floats(f2)) / double(block_acts_floats(f1));
  const double scratch_ratio = double(block_scratch_floats(f2)) / double(block_scratch_floats(f1));
  INFO("flash: acts " << block_acts_floats(f1) << " -> " << block_acts_floats(f2) << " floats, scratch "
                      << block_scratch_floats(f1) << " -> " << block_scratch_floats(f2));
  CHECK(acts_ratio == Approx(2.0).epsilon(1e-12));
  CHECK(scratch_ratio == Approx(2.0).epsilon(1e-12));
  // The reference holds B*NH*T*T probabilities and as much scratch: more than linear growth.
  const double ref_ratio = double(block_acts_floats(r2)) / double(block_acts_floats(r1));
  INFO("reference: acts " << block_acts_floats(r1) << " -> " << block_acts_floats(r2) << " floats");
  CHECK(ref_ratio > 2.5);
  CHECK(block_acts_floats(r2) - block_acts_floats(f2) == size_t(12) * 2048 * 2048 - size_t(12) * 2048);
  CHECK(block_scratch_floats(r2) - block_scratch_floats(f2) == size_t(12) * 2048 * 2048 - size_t(12) * 2048);

  // The carve hands out lse (not att) on the flash path, att (not lse) on the reference path,
  // and stays inside block_acts_floats.
  std::vector<float> buf(block_acts_floats(m.dims(2, 8, Attention::kFlash)));
  const BlockActs fa = carve_block_acts(buf.data(), m.dims(2, 8, Attention::kFlash));
  CHECK(fa.att == nullptr);
  CHECK(fa.lse != nullptr);
  CHECK(fa.fch_gelu + size_t(2) * 8 * 4 * 768 <= buf.data() + buf.size());
  std::vector<float> buf_r(block_acts_floats(m.dims(2, 8, Attention::kReference)));
  const BlockActs ra = carve_block_acts(buf_r.data(), m.dims(2, 8, Attention::kReference));
  CHECK(ra.att != nullptr);
  CHECK(ra.lse == nullptr);
  CHECK(ra.fch_gelu + size_t(2) * 8 * 4 * 768 <= buf_r.data() + buf_r.size());
}
