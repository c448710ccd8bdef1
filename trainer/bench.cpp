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

std::string bench_optimizer(int threads, size_t n, int reps) {
  Rng rng(42);
  std::vector<float> p(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = rng.normal() * 0.02f;
    m[i] = rng.normal() * 1e-3f;
    v[i] = std::abs(rng.normal()) * 1e-6f;
    g[i] = rng.normal() * 1e-2f;
  }
  std::vector<float> po(n), mo(n), vo(n), ps(n), ms(n), vs(n);
  AdamWConfig c;
  const AdamWStep st = make_step(c, 3e-4f, 10, 0.9f);
  using Clock = std::chrono::steady_clock;
  auto best = [&](auto&& fn) {
    double b = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      fn();
      b = std::min(b, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return b;
  };
  // Out of place (double-buffered) so every repetition computes the same values.
  const double t_scalar = best([&] {
    adamw_update_scalar(p.data(), m.data(), v.data(), g.data(), ps.data(), ms.data(), vs.data(), n, st, true);
  });
  omp_set_num_threads(1);
  const double t_simd1 = best([&] {
    adamw_update(p.data(), m.data(), v.data(), g.data(), po.data(), mo.data(), vo.data(), n, st, true);
  });
  omp_set_num_threads(threads);
  const double t_simd = best([&] {
    adamw_update(p.data(), m.data(), v.data(), g.data(), po.data(), mo.data(), vo.data(), n, st, true);
  });
  const bool same = std::memcmp(po.data(), ps.data(), n * 4) == 0 &&
                    std::memcmp(mo.data(), ms.data(), n * 4) == 0 &&
                    std::memcmp(vo.data(), vs.data(), n * 4) == 0;
  const double bytes = static_cast<double>(n) * 4 * 7;  // read p, m, v, g; write p, m, v
  auto line = [&](const char* name, double t, const char* extra) {
    const double value = static_cast<double>(n) / t / 1e6, base = static_cast<double>(n) / t_scalar / 1e6;
    return fmt::format("{{\"name\":\"{}\",\"bytes\":{:.0f},\"value\":{:.1f},\"unit\":\"Melem/s\","
                       "\"baseline\":{:.1f},\"ratio\":{:.2f},\"gbps\":{:.2f},\"isa\":\"{}\","
                       "\"bit_identical\":{}{}}}\n",
                       name, bytes, value, base, value / base, bytes / t / 1e9, adamw_isa(),
                       same ? "true" : "false", extra);
  };
  return line("adamw_shard_simd_1thread", t_simd1, ",\"threads\":1") +
         line("adamw_shard_simd", t_simd, fmt::format(",\"threads\":{}", threads).c_str());
}

}  // namespace tier::train
