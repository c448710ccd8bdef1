// ExtentAllocator: exact behaviour on small cases, random churn against a brute-force bitmap
// model, and a fragmentation measurement under create/delete churn (docs/allocator.md).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "ram/extent_allocator.hpp"

using tier::daemon::ExtentAllocator;

namespace {
constexpr uint64_t G = ExtentAllocator::kGranule;
constexpr uint64_t M2 = 2ull << 20;
}  // namespace

TEST_CASE("allocator: allocate, free and coalesce") {
  ExtentAllocator a(16 * G);
  CHECK(a.capacity() == 16 * G);
  auto x = a.allocate(G);
  auto y = a.allocate(3 * G - 100);  // rounded up to 3 granules
  auto z = a.allocate(2 * G);
  REQUIRE(x);
  REQUIRE(y);
  REQUIRE(z);
  CHECK(a.used() == 6 * G);
  CHECK(*x == 0);
  CHECK(*y == G);
  CHECK(*z == 4 * G);
  REQUIRE(a.free(*y, 3 * G));
  CHECK(a.free_ranges() == 2);
  CHECK_FALSE(a.free(*y, 3 * G));      // double free
  CHECK_FALSE(a.free(*x + G / 2, G));  // unaligned
  REQUIRE(a.free(*x, G));
  CHECK(a.free_ranges() == 2);  // [0,4G) merged; [6G,16G)
  REQUIRE(a.free(*z, 2 * G));
  CHECK(a.free_ranges() == 1);
  CHECK(a.largest_free() == 16 * G);
  CHECK(a.used() == 0);
  CHECK(a.fragmentation() == 0.0);
}

TEST_CASE("allocator: best fit picks the smallest range that fits") {
  ExtentAllocator a(64 * G);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 8; ++i) offs.push_back(*a.allocate(4 * G));
  // Holes of 4G at offs[1] and 8G at offs[3..4]; remaining tail 32G.
  REQUIRE(a.free(offs[1], 4 * G));
  REQUIRE(a.free(offs[3], 4 * G));
  REQUIRE(a.free(offs[4], 4 * G));
  CHECK(*a.allocate(3 * G) == offs[1]);
  CHECK(*a.allocate(6 * G) == offs[3]);
}

TEST_CASE("allocator: alignment") {
  ExtentAllocator a(64ull << 20);
  auto small = a.allocate(G);
  REQUIRE(small);
  auto big = a.allocate(3ull << 20, M2);
  REQUIRE(big);
  CHECK(*big % M2 == 0);
  CHECK(*big == M2);            // the first 2 MiB boundary after the small one
  auto filler = a.allocate(G);  // fills the gap before the aligned block (best fit)
  REQUIRE(filler);
  CHECK(*filler < M2);
  CHECK_FALSE(a.allocate(G, 3 * G));  // not a power of two
  CHECK_FALSE(a.allocate(0));
}

TEST_CASE("allocator: exhaustion and reserve") {
  ExtentAllocator a(8 * G);
  for (int i = 0; i < 8; ++i) REQUIRE(a.allocate(G));
  CHECK_FALSE(a.allocate(G));
  CHECK(a.free_bytes() == 0);
  CHECK_FALSE(a.allocate(9 * G));
  ExtentAllocator b(8 * G);
  REQUIRE(b.reserve(2 * G, 2 * G));
  CHECK_FALSE(b.reserve(3 * G, 2 * G));  // overlaps
  CHECK(b.used() == 2 * G);
  CHECK(*b.allocate(2 * G) == 0);
  CHECK(*b.allocate(G) == 4 * G);
}

TEST_CASE("allocator: random churn agrees with a bitmap model") {
  constexpr uint64_t kUnits = 4096;  // 16 MiB
  ExtentAllocator a(kUnits * G);
  std::vector<bool> bits(kUnits, false);
  std::map<uint64_t, uint64_t> live;  // offset -> size
  std::mt19937_64 rng(42);
  auto longest_run = [&] {
    uint64_t best = 0, cur = 0;
    for (bool b : bits) {
      cur = b ? 0 : cur + 1;
      best = std::max(best, cur);
    }
    return best;
  };
  for (int step = 0; step < 20000; ++step) {
    bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      uint64_t units = 1 + rng() % 64;
      uint64_t align = rng() % 4 == 0 ? 16 * G : G;
      auto off = a.allocate(units * G, align);
      if (off) {
        REQUIRE(*off % align == 0);
        REQUIRE(*off + units * G <= a.capacity());
        for (uint64_t u = *off / G; u < *off / G + units; ++u) {
          REQUIRE_FALSE(bits[u]);
          bits[u] = true;
        }
        live[*off] = units * G;
      } else {
        // Failing is allowed only when no range could certainly hold it.
        uint64_t need = align == G ? units : units + align / G - 1;
        REQUIRE(longest_run() < need);
      }
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      REQUIRE(a.free(it->first, it->second));
      for (uint64_t u = it->first / G; u < (it->first + it->second) / G; ++u) bits[u] = false;
      live.erase(it);
    }
    if (step % 500 == 0) {
      uint64_t used = 0;
      for (bool b : bits) used += b;
      REQUIRE(a.used() == used * G);
      REQUIRE(a.largest_free() == longest_run() * G);
    }
  }
  for (auto& [off, size] : live) REQUIRE(a.free(off, size));
  CHECK(a.free_ranges() == 1);
  CHECK(a.used() == 0);
}

// The measurement quoted in docs/allocator.md: tensors of log-uniform sizes 64 KiB..256 MiB
// (large ones 2 MiB-aligned as in an arena), filled to a target occupancy, then random
// delete/create churn. Reports the free-space fragmentation and the occupancy reached when
// the first create fails.
TEST_CASE("allocator: fragmentation under random create/delete churn", "[measure]") {
  constexpr uint64_t kCap = 16ull << 30;
  for (double target : {0.5, 0.7, 0.85}) {
    ExtentAllocator a(kCap);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> logsize(std::log2(64.0 * 1024), std::log2(256.0 * 1024 * 1024));
    std::vector<std::pair<uint64_t, uint64_t>> live;
    auto create = [&]() -> bool {
      uint64_t size = static_cast<uint64_t>(std::exp2(logsize(rng)));
      auto off = a.allocate(size, size >= M2 ? M2 : G);
      if (!off) return false;
      live.emplace_back(*off, size);
      return true;
    };
    while (static_cast<double>(a.used()) < target * kCap) REQUIRE(create());
    double frag_sum = 0, frag_max = 0;
    uint64_t failures = 0, ops = 20000;
    size_t ranges_max = 0;
    for (uint64_t i = 0; i < ops; ++i) {
      size_t k = rng() % live.size();
      REQUIRE(a.free(live[k].first, live[k].second));
      live[k] = live.back();
      live.pop_back();
      while (static_cast<double>(a.used()) < target * kCap)
        if (!create()) {
          ++failures;
          break;
        }
      frag_sum += a.fragmentation();
      frag_max = std::max(frag_max, a.fragmentation());
      ranges_max = std::max(ranges_max, a.free_ranges());
    }
    // Then fill until the first failure: how much of the arena is usable after churn.
    uint64_t fill_creates = 0;
    while (create()) ++fill_creates;
    double usable = static_cast<double>(a.used()) / kCap;
    std::printf(
        "{\"name\":\"allocator_churn\",\"occupancy\":%.2f,\"ops\":%llu,"
        "\"mean_fragmentation\":%.4f,\"max_fragmentation\":%.4f,\"max_free_ranges\":%zu,"
        "\"create_failures\":%llu,\"usable_after_churn\":%.4f}\n",
        target, static_cast<unsigned long long>(ops), frag_sum / ops, frag_max, ranges_max,
        static_cast<unsigned long long>(failures), usable);
    // Up to 70 % occupancy churn never fails a create; at 85 % some creates of the largest
    // sizes find no range (documented), yet most of the arena stays usable.
    if (target <= 0.7) CHECK(failures == 0);
    CHECK(usable > 0.8);
  }
}
