#include "trainer/bench.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "trainer/cpu/attention.hpp"
#include "trainer/model.hpp"
#include "trainer/optimizer.hpp"

namespace tier::train {

namespace {

// One shard size: the scalar loop, the vectorized update on 1 thread and on `threads`
// threads, interleaved repetition by repetition so that load on the machine hits all three
// alike; the best repetition of each counts.
std::string bench_size(int threads, size_t n, int reps) {
  Rng rng(42);
  std::vector<float> p(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = rng.normal() * 0.02f;
    m[i] = rng.normal() * 1e-3f;
    v[i] = std::abs(rng.normal()) * 1e-6f;
    g[i] = rng.normal() * 1e-2f;
  }
  std::vector<float> po(n), mo(n), vo(n), ps(n), ms(n), vs(n);
  const AdamWStep st = make_step(AdamWConfig{}, 3e-4f, 10, 0.9f);
  using Clock = std::chrono::steady_clock;
  // Inner repetitions so that each timed sample is at least ~8M elements.
  const int inner = static_cast<int>(std::max<size_t>(1, (size_t{1} << 23) / n));
  auto time = [&](auto&& fn) {
    const auto t0 = Clock::now();
    for (int k = 0; k < inner; ++k) fn();
    return std::chrono::duration<double>(Clock::now() - t0).count() / inner;
  };
  // Out of place (double-buffered) so every repetition computes the same values.
  auto scalar = [&] {
    adamw_update_scalar(p.data(), m.data(), v.data(), g.data(), ps.data(), ms.data(), vs.data(), n, st, true);
  };
  auto simd = [&] {
    adamw_update(p.data(), m.data(), v.data(), g.data(), po.data(), mo.data(), vo.data(), n, st, true);
  };
  double t_scalar = 1e30, t_simd1 = 1e30, t_simd = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_scalar = std::min(t_scalar, time(scalar));
    omp_set_num_threads(1);
    t_simd1 = std::min(t_simd1, time(simd));
    omp_set_num_threads(threads);
    t_simd = std::min(t_simd, time(simd));
  }
  const bool same = std::memcmp(po.data(), ps.data(), n * 4) == 0 &&
                    std::memcmp(mo.data(), ms.data(), n * 4) == 0 &&
                    std::memcmp(vo.data(), vs.data(), n * 4) == 0;
  const double bytes = static_cast<double>(n) * 4 * 7;  // read p, m, v, g; write p, m, v
  auto line = [&](const char* name, double t, int th) {
    const double value = static_cast<double>(n) / t / 1e6;
    const double base = static_cast<double>(n) / t_scalar / 1e6;
    return fmt::format(
        "{{\"name\":\"{}\",\"bytes\":{:.0f},\"value\":{:.1f},\"unit\":\"Melem/s\","
        "\"baseline\":{:.1f},\"ratio\":{:.2f},\"gbps\":{:.2f},\"isa\":\"{}\","
        "\"threads\":{},\"bit_identical\":{}}}\n",
        name, bytes, value, base, value / base, bytes / t / 1e9, adamw_isa(), th, same ? "true" : "false");
  };
  return line("adamw_shard_simd", t_simd1, 1) + line("adamw_shard_simd_threads", t_simd, threads);
}

}  // namespace

std::string bench_optimizer(int threads, size_t floats, int reps) {
  // A shard that stays in cache (compute-bound: SIMD shows) and one that streams from DRAM
  // (memory-bound, as large shards are).
  return bench_size(threads, size_t{1} << 15, reps) + bench_size(threads, floats, reps);
}

namespace {

// One sequence length: forward + backward of each form, interleaved; the best repetition counts.
std::string bench_attention_at(int threads, int B, int T, int reps) {
  constexpr int NH = 12, HS = 64, C = NH * HS;
  const size_t BT = static_cast<size_t>(B) * T, rows = static_cast<size_t>(B) * NH * T;
  Rng rng(7);
  std::vector<float> qkv(BT * 3 * C), dout(BT * C);
  for (auto& x : qkv) x = rng.normal();
  for (auto& x : dout) x = rng.normal();
  std::vector<float> out_r(BT * C), att(rows * T), datt(rows * T), dqkv_r(BT * 3 * C);
  std::vector<float> out_f(BT * C), lse(rows), drow(rows), dqkv_f(BT * 3 * C);
  using Clock = std::chrono::steady_clock;
  auto time = [](auto&& fn) {
    const auto t0 = Clock::now();
    fn();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto ref_fwd = [&] { attention_forward_reference(out_r.data(), att.data(), qkv.data(), B, T, C, NH); };
  auto ref_bwd = [&] {
    attention_backward_reference(dqkv_r.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                                 NH);
  };
  auto flash_fwd = [&] { attention_forward_flash(out_f.data(), lse.data(), qkv.data(), B, T, C, NH); };
  auto flash_bwd = [&] {
    attention_backward_flash(dqkv_f.data(), drow.data(), dout.data(), qkv.data(), out_f.data(), lse.data(), B,
                             T, C, NH);
  };
  // Untimed first: touches the buffers and starts the threads.
  ref_fwd();
  ref_bwd();
  flash_fwd();
  flash_bwd();
  // Per repetition: forward then backward of each; the best forward and the best backward count.
  double rf = 1e30, rb = 1e30, ff = 1e30, fb = 1e30;
  for (int r = 0; r < reps; ++r) {
    rf = std::min(rf, time(ref_fwd));
    rb = std::min(rb, time(ref_bwd));
    ff = std::min(ff, time(flash_fwd));
    fb = std::min(fb, time(flash_bwd));
  }
  const double t_ref = rf + rb, t_flash = ff + fb;
  // The two must agree (attention_test.cpp checks it properly): max |diff| / max |reference|.
  double diff = 0, scale = 0;
  for (size_t i = 0; i < dqkv_r.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(dqkv_f[i] - dqkv_r[i])));
    scale = std::max(scale, static_cast<double>(std::abs(dqkv_r[i])));
  }
  const double ref_bytes = 2.0 * static_cast<double>(rows) * T * 4,
               flash_bytes = 2.0 * static_cast<double>(rows) * 4;
  return fmt::format(
      "{{\"name\":\"attention_fwd_bwd\",\"T\":{},\"B\":{},\"NH\":{},\"HS\":{},\"flash_ms\":{:.3f},"
      "\"reference_ms\":{:.3f},\"ratio\":{:.2f},\"flash_fwd_ms\":{:.3f},\"flash_bwd_ms\":{:.3f},"
      "\"reference_fwd_ms\":{:.3f},\"reference_bwd_ms\":{:.3f},\"flash_bytes\":{:.0f},"
      "\"reference_bytes\":{:.0f},\"max_rel_diff\":{:.2e},\"threads\":{}}}\n",
      T, B, NH, HS, t_flash * 1e3, t_ref * 1e3, t_ref / t_flash, ff * 1e3, fb * 1e3, rf * 1e3, rb * 1e3,
      flash_bytes, ref_bytes, diff / scale, threads);
}

}  // namespace

std::string bench_attention(int threads, int reps) {
  omp_set_num_threads(threads);
  return bench_attention_at(threads, 4, 256, reps) + bench_attention_at(threads, 1, 1024, reps);
}

}  // namespace tier::train
