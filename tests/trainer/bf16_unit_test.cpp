// bf16 conversions (trainer/bf16.hpp): exact bit patterns, the bulk conversions against the
// scalar ones, and the fp32 sum of the bf16 reduce-scatter.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "trainer/bf16.hpp"

using namespace tier::train;

namespace {
float f(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
}  // namespace

TEST_CASE("bf16: round to nearest even, exact bit patterns", "[trainer][bf16]") {
  CHECK(bf16_from_f32(1.0f) == 0x3f80);
  CHECK(bf16_from_f32(-2.0f) == 0xc000);
  CHECK(bf16_from_f32(0.0f) == 0x0000);
  CHECK(bf16_from_f32(-0.0f) == 0x8000);
  // Below, at and above the halfway point between 0x3f80 and 0x3f81.
  CHECK(bf16_from_f32(f(0x3f807fff)) == 0x3f80);
  CHECK(bf16_from_f32(f(0x3f808000)) == 0x3f80);  // tie: to the even 0x3f80
  CHECK(bf16_from_f32(f(0x3f808001)) == 0x3f81);
  CHECK(bf16_from_f32(f(0x3f818000)) == 0x3f82);  // tie: to the even 0x3f82
  CHECK(bf16_from_f32(f(0x3f817fff)) == 0x3f81);
  CHECK(bf16_from_f32(f(0xbf818000)) == 0xbf82);  // negative ties alike
  // Infinities stay; the largest finite fp32 and values past bf16's largest round to inf.
  CHECK(bf16_from_f32(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf16_from_f32(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf16_from_f32(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bf16_from_f32(f(0x7f7f7fff)) == 0x7f7f);  // just under the halfway point: bf16 max
  CHECK(bf16_from_f32(f(0x7f7f8000)) == 0x7f80);  // tie with odd 0x7f7f: up to inf
  // Denormals round like any value (no flush to zero).
  CHECK(bf16_from_f32(f(0x00000001)) == 0x0000);
  CHECK(bf16_from_f32(f(0x00008000)) == 0x0000);  // tie: to even 0
  CHECK(bf16_from_f32(f(0x00018000)) == 0x0002);  // tie: to even 2
  CHECK(bf16_from_f32(f(0x00008001)) == 0x0001);
  CHECK(bf16_from_f32(f(0x007fffff)) == 0x0080);  // the largest denormal rounds to the smallest normal
  CHECK(bf16_from_f32(f(0x80010000)) == 0x8001);
  // NaN stays NaN, quiet, with its sign, even when its payload is only in the low bits.
  CHECK(bf16_from_f32(std::numeric_limits<float>::quiet_NaN()) == 0x7fc0);
  CHECK(bf16_from_f32(f(0x7f800001)) == 0x7fc0);
  CHECK(bf16_from_f32(f(0xff800001)) == 0xffc0);
  CHECK(bf16_from_f32(f(0x7fa00000)) == 0x7fe0);
  CHECK(std::isnan(bf16_to_f32(bf16_from_f32(f(0x7f800001)))));
}

TEST_CASE("bf16: widening is exact and every bf16 survives the round trip", "[trainer][bf16]") {
  CHECK(bits(bf16_to_f32(0x3f81)) == 0x3f810000u);
  CHECK(bits(bf16_to_f32(0x0001)) == 0x00010000u);
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float x = bf16_to_f32(static_cast<bf16_t>(h));
    if (std::isnan(x)) {
      CHECK(std::isnan(bf16_to_f32(bf16_from_f32(x))));
      continue;
    }
    if (bf16_from_f32(x) != h) FAIL("bf16 " << h << " does not round-trip");
  }
}

TEST_CASE("bf16: the bulk conversions give the scalar ones' bits at every length and offset",
          "[trainer][bf16]") {
  std::mt19937 rng(3);
  const size_t n = (1 << 16) + 37;  // two OpenMP chunks and a remainder
  std::vector<float> x(n);
  for (auto& v : x) v = f(static_cast<uint32_t>(rng()));  // every class: denormals, NaN, inf
  for (size_t off : {size_t{0}, size_t{1}, size_t{7}}) {
    std::vector<bf16_t> h(n - off);
    f32_to_bf16(x.data() + off, h.data(), n - off);
    std::vector<float> back(n - off);
    bf16_to_f32(h.data(), back.data(), n - off);
    size_t bad = 0;
    for (size_t i = 0; i < n - off; ++i) {
      bad += h[i] != bf16_from_f32(x[off + i]);
      bad += bits(back[i]) != static_cast<uint32_t>(h[i]) << 16;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("bf16: round to nearest agrees with the nearest bf16 found by search", "[trainer][bf16]") {
  // Independent of the bit trick: the two bf16 neighbours of x, the nearer (the even on a tie).
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1e4f, 1e4f);
  for (int k = 0; k < 200000; ++k) {
    const float x = u(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 200) - 100));
    const uint32_t lo_bits = bits(x) & 0xffff0000u;
    const double lo = f(lo_bits), hi = f(lo_bits + 0x10000u);  // towards zero, away from zero
    const double dlo = std::fabs(x - lo), dhi = std::fabs(hi - x);
    const uint32_t want =
        (dlo < dhi || (dlo == dhi && ((lo_bits >> 16) & 1u) == 0)) ? lo_bits >> 16 : (lo_bits >> 16) + 1;
    if (bf16_from_f32(x) != want) FAIL("x = " << x);
  }
}

TEST_CASE("bf16: the reduce-scatter's sum is accumulated in fp32 in rank order and rounded once",
          "[trainer][bf16]") {
  // 3 ranks, 2 elements: chunks [3 * 2].
  const bf16_t one = 0x3f80, eps = 0x3b80 /* 2^-8 */, big = 0x4b80 /* 2^24 */, nbig = 0xcb80, unit = 0x3f80;
  const std::vector<bf16_t> chunks = {one, big, eps, unit, eps, nbig};
  std::vector<bf16_t> out(2);
  sum_chunks_bf16(chunks.data(), 3, 2, out.data());
  // 1 + 2^-8 + 2^-8 = 1 + 2^-7 in fp32 (a bf16 accumulator would round each 1 + 2^-8 to 1).
  CHECK(out[0] == 0x3f81);
  // (2^24 + 1) - 2^24 in fp32, in rank order: 0 (any other order, or double, gives 1).
  CHECK(out[1] == 0x0000);
  CHECK(sum_squares_bf16(chunks.data(), 2) == Approx(1.0 + std::exp2(48.0)));
}
