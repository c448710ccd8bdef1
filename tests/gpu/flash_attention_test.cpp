// The CUDA flash attention kernels (trainer/cuda/flash_attention.cu) against the CPU reference
// attention (trainer/cpu/attention_reference.cpp, materialized [B,NH,T,T]): forward output and
// logsumexp, backward dqkv, at GPT-2 head shapes, at T that are and are not multiples of the
// 32-row tile, at T = 1, and at every head-size class of the kernels (HS <= 32, 64, 128, 256).
// Skips visibly without a device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gpu_support.hpp"
#include "support/attention_check.hpp"
#include "trainer/cpu/attention.hpp"
#include "trainer/cuda/kernels.hpp"
#include "trainer/model.hpp"

using namespace tier::train;

namespace {

using tier::test::randn;
using tier::test::rel_err;

struct DevBuf {
  float* p = nullptr;
  explicit DevBuf(size_t n) { (void)cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * 4); }
  DevBuf(const std::vector<float>& h) : DevBuf(h.size()) {
    (void)cudaMemcpy(p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  }
  ~DevBuf() { (void)cudaFree(p); }
  std::vector<float> get(size_t n) const {
    std::vector<float> h(n);
    (void)cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost);
    return h;
  }
};

// fp32 on both sides; the sums run in other orders and expf is not std::exp, so the results
// agree to some ulps of the largest value.
constexpr double kTol = 1e-5;

struct Shape {
  int B, NH, HS, T;
};

}  // namespace

TEST_CASE("CUDA flash attention matches the reference attention, forward and backward", "[gpu][attention]") {
  if (!tier::test::have_cuda_device()) return;
  const Shape shape = GENERATE(Shape{2, 6, 64, 256},    // GPT-2 heads, 8 whole tiles
                               Shape{2, 6, 64, 200},    // T not a multiple of the tile
                               Shape{1, 12, 64, 1024},  // GPT-2 124M's sequence
                               Shape{1, 4, 128, 100},   // HS 128 (GPT-3 1.3B and up)
                               Shape{1, 2, 256, 70},    // HS 256: over 48 KiB of shared memory
                               Shape{2, 4, 8, 33},      // HS 8 (the tiny preset), one row past a tile
                               Shape{3, 2, 8, 1});      // T = 1
  const int B = shape.B, NH = shape.NH, T = shape.T, C = NH * shape.HS;
  INFO("B=" << B << " NH=" << NH << " HS=" << shape.HS << " T=" << T);
  const size_t BT = size_t(B) * T, rows = size_t(B) * NH * T;
  const std::vector<float> qkv = randn(BT * 3 * C, 1, 1.0f);
  const std::vector<float> dout = randn(BT * C, 2, 1.0f);

  std::vector<float> out_ref(BT * C), att(rows * T), dqkv_ref(BT * 3 * C), datt(rows * T);
  attention_forward_reference(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_backward_reference(dqkv_ref.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                               NH);
  std::vector<float> lse_ref(rows, NAN), out_cpu(BT * C);
  attention_forward_flash(out_cpu.data(), lse_ref.data(), qkv.data(), B, T, C, NH);

  DevBuf dqkv_in(qkv), ddout(dout), dout_g(BT * C), dlse(rows), ddq(BT * 3 * C), ddrow(rows);
  // Poison the outputs: the kernels must overwrite every element.
  REQUIRE(cudaMemset(dout_g.p, 0xff, BT * C * 4) == cudaSuccess);
  REQUIRE(cudaMemset(ddq.p, 0xff, BT * 3 * C * 4) == cudaSuccess);
  REQUIRE(cuda::flash_attention_forward(dout_g.p, dlse.p, dqkv_in.p, B, T, C, NH, nullptr) == cudaSuccess);
  REQUIRE(cuda::flash_attention_backward(ddq.p, ddrow.p, ddout.p, dqkv_in.p, dout_g.p, dlse.p, B, T, C, NH,
                                         nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> out = dout_g.get(BT * C), lse = dlse.get(rows), dqkv = ddq.get(BT * 3 * C);

  const double e_out = rel_err(out, out_ref, C, 0, C);
  const double e_lse = rel_err(lse, lse_ref, rows, 0, rows);
  const double e_dq = rel_err(dqkv, dqkv_ref, 3 * C, 0, C);
  const double e_dk = rel_err(dqkv, dqkv_ref, 3 * C, C, C);
  const double e_dv = rel_err(dqkv, dqkv_ref, 3 * C, 2 * C, C);
  INFO("max abs error / max |reference|: out " << e_out << ", lse (vs CPU flash) " << e_lse << ", dq " << e_dq
                                               << ", dk " << e_dk << ", dv " << e_dv);
  CHECK(e_out <= kTol);
  CHECK(e_lse <= kTol);
  CHECK(e_dq <= kTol);
  CHECK(e_dk <= kTol);
  CHECK(e_dv <= kTol);
}

TEST_CASE("CUDA flash attention refuses head sizes over 256", "[gpu][attention]") {
  // Checked before any launch, so it needs no device.
  CHECK(cuda::flash_attention_forward(nullptr, nullptr, nullptr, 1, 4, 2 * 512, 2, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(cuda::flash_attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2 * 512, 2,
                                       nullptr) == cudaErrorInvalidValue);
}

// The tensor-core kernels (flash_attention_tc.cu: bf16 operands, fp32 accumulation) against the
// same CPU reference, at the shapes the GPU check trains (350M: 16 heads of 64, T = 1024),
// 1.3B's head size (128) at a T that is not a multiple of the 64-row tile, head size 32 one
// row past a tile, and T = 1. bf16 rounds q, k, v, P, dS and dout to 8 bits of mantissa, so the
// bound is bf16's, not fp32's: 2e-2 of the largest value (the bf16 GEMMs' tests allow 3e-2).
TEST_CASE("tensor-core flash attention matches the reference attention to bf16 accuracy",
          "[gpu][attention]") {
  if (!tier::test::have_cuda_device()) return;
  const Shape shape = GENERATE(Shape{1, 16, 64, 1024},  // 350M, the run's shape (per sequence)
                               Shape{2, 4, 128, 200},   // HS 128, partial last tile
                               Shape{2, 3, 32, 65},     // HS 32, one row past a tile
                               Shape{3, 2, 64, 1});     // T = 1
  const int B = shape.B, NH = shape.NH, T = shape.T, C = NH * shape.HS;
  INFO("B=" << B << " NH=" << NH << " HS=" << shape.HS << " T=" << T);
  REQUIRE(cuda::flash_attention_tc_supported(B, T, C, NH));
  const size_t BT = size_t(B) * T, rows = size_t(B) * NH * T;
  const std::vector<float> qkv = randn(BT * 3 * C, 3, 1.0f);
  const std::vector<float> dout = randn(BT * C, 4, 1.0f);
  std::vector<float> out_ref(BT * C), att(rows * T), dqkv_ref(BT * 3 * C), datt(rows * T);
  attention_forward_reference(out_ref.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_backward_reference(dqkv_ref.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                               NH);
  std::vector<float> lse_ref(rows, NAN), out_cpu(BT * C);
  attention_forward_flash(out_cpu.data(), lse_ref.data(), qkv.data(), B, T, C, NH);

  DevBuf dqkv_in(qkv), ddout(dout), dout_g(BT * C), dlse(rows), ddq(BT * 3 * C), ddrow(rows);
  REQUIRE(cudaMemset(dout_g.p, 0xff, BT * C * 4) == cudaSuccess);  // NaN: every element is written
  REQUIRE(cudaMemset(ddq.p, 0xff, BT * 3 * C * 4) == cudaSuccess);
  REQUIRE(cuda::flash_attention_forward_tc(dout_g.p, dlse.p, dqkv_in.p, B, T, C, NH, nullptr) == cudaSuccess);
  REQUIRE(cuda::flash_attention_backward_tc(ddq.p, ddrow.p, ddout.p, dqkv_in.p, dout_g.p, dlse.p, B, T, C, NH,
                                            nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> out = dout_g.get(BT * C), lse = dlse.get(rows), dqkv = ddq.get(BT * 3 * C);
  const double e_out = rel_err(out, out_ref, C, 0, C);
  const double e_lse = rel_err(lse, lse_ref, rows, 0, rows);
  const double e_dq = rel_err(dqkv, dqkv_ref, 3 * C, 0, C);
  const double e_dk = rel_err(dqkv, dqkv_ref, 3 * C, C, C);
  const double e_dv = rel_err(dqkv, dqkv_ref, 3 * C, 2 * C, C);
  INFO("max abs error / max |reference|: out " << e_out << ", lse " << e_lse << ", dq " << e_dq << ", dk "
                                               << e_dk << ", dv " << e_dv);
  // rel_err's std::max skips NaN: every element written and finite is checked here.
  const auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  CHECK(finite(out));
  CHECK(finite(lse));
  CHECK(finite(dqkv));
  constexpr double kBf16Tol = 2e-2;
  CHECK(e_out <= kBf16Tol);
  CHECK(e_lse <= kBf16Tol);
  CHECK(e_dq <= kBf16Tol);
  CHECK(e_dk <= kBf16Tol);
  CHECK(e_dv <= kBf16Tol);
  // And not the fp32 result by accident: bf16 rounding shows (the fp32 kernels reach 1e-5).
  CHECK(e_out > 1e-6);
}

TEST_CASE("tensor-core flash attention refuses head sizes it has no kernel for", "[gpu][attention]") {
  // Checked before any launch, so it needs no device.
  CHECK_FALSE(cuda::flash_attention_tc_supported(1, 16, 4 * 8, 4));    // HS 8 (tiny): fp32 kernels
  CHECK_FALSE(cuda::flash_attention_tc_supported(1, 16, 2 * 256, 2));  // HS 256
  CHECK_FALSE(cuda::flash_attention_tc_supported(1, 16, 2 * 96, 2));   // HS 96
  CHECK(cuda::flash_attention_tc_supported(1, 16, 16 * 64, 16));
  CHECK(cuda::flash_attention_forward_tc(nullptr, nullptr, nullptr, 1, 4, 2 * 256, 2, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(cuda::flash_attention_backward_tc(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2 * 96,
                                          2, nullptr) == cudaErrorInvalidValue);
}
