// Helpers of the attention tests (CPU and CUDA): seeded normal inputs and a relative error
// over a column range, the way both compare flash attention against the reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainer/model.hpp"

namespace tier::test {

// n floats N(0, s^2) from the trainer's own deterministic generator.
inline std::vector<float> randn(size_t n, uint64_t seed, float s) {
  tier::train::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * s;
  return v;
}

// max |got - want| / max |want| over every row of `width` floats, taking `cols` columns from
// offset `col0` (one of q, k, v in a [.,3C] buffer).
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want, size_t width,
                      size_t col0, size_t cols) {
  double diff = 0, scale = 0;
  for (size_t r = 0; r < want.size() / width; ++r)
    for (size_t c = col0; c < col0 + cols; ++c) {
      const size_t i = r * width + c;
      diff = std::max(diff, std::abs(double(got[i]) - double(want[i])));
      scale = std::max(scale, std::abs(double(want[i])));
    }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace tier::test
