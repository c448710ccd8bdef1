#include "trainer/bench.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

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

}  // namespace tier::train
