#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <vector>

#include "nvme/extent_allocator.hpp"

using tier::nvme::ExtentAllocator;

TEST_CASE("extent allocator: best fit picks the smallest range that holds the request") {
  ExtentAllocator a(4096, 0);
  REQUIRE(a.add_range(0, 64 * 4096).is_ok());
  auto x = a.allocate(8 * 4096);   // [0,8)
  auto y = a.allocate(2 * 4096);   // [8,10)
  auto z = a.allocate(20 * 4096);  // [10,30)
  REQUIRE((x && y && z));
  REQUIRE(a.release(*y, 2 * 4096).is_ok());  // hole of 2 pages at 8; tail of 34 pages at 30
  auto w = a.allocate(4096);
  REQUIRE(w);
  CHECK(*w == 8 * 4096);  // the 2-page hole, not the big tail
  auto v = a.allocate(3 * 4096);
  REQUIRE(v);
  CHECK(*v == 30 * 4096);
  CHECK(a.used_bytes() == (8 + 1 + 20 + 3) * 4096u);
}

TEST_CASE("extent allocator: lengths round up to the alignment") {
  ExtentAllocator a(4096, 0);
  REQUIRE(a.add_range(0, 16 * 4096).is_ok());
  auto x = a.allocate(1);
  auto y = a.allocate(4097);
  REQUIRE((x && y));
  CHECK(*y - *x == 4096);
  CHECK(a.used_bytes() == 3 * 4096u);
  CHECK_FALSE(a.allocate(14 * 4096).has_value());
}

TEST_CASE("extent allocator: freeing everything coalesces back to one range per segment") {
  ExtentAllocator a(4096, 16 * 4096);  // segments of 16 pages (one data file each)
  REQUIRE(a.add_range(0, 64 * 4096).is_ok());
  CHECK(a.free_ranges() == 4);
  std::mt19937_64 g(7);
  std::vector<std::pair<uint64_t, uint64_t>> held;
  for (;;) {
    uint64_t len = (g() % 5 + 1) * 4096;
    auto off = a.allocate(len);
    if (!off) break;
    // never across a segment boundary
    CHECK(*off / (16 * 4096) == (*off + len - 1) / (16 * 4096));
    held.push_back({*off, len});
  }
  std::shuffle(held.begin(), held.end(), g);
  for (auto [o, l] : held) REQUIRE(a.release(o, l).is_ok());
  CHECK(a.free_bytes() == 64 * 4096u);
  CHECK(a.free_ranges() == 4);  // merged within segments, never across
  CHECK(a.largest_free() == 16 * 4096u);
}

TEST_CASE("extent allocator: double free and reserve of used space are refused") {
  ExtentAllocator a(4096, 0);
  REQUIRE(a.add_range(0, 8 * 4096).is_ok());
  auto x = a.allocate(4096);
  REQUIRE(x);
  REQUIRE(a.release(*x, 4096).is_ok());
  CHECK(a.release(*x, 4096).code() == tier::Code::kInternal);
  REQUIRE(a.reserve(4 * 4096, 2 * 4096).is_ok());
  CHECK(a.reserve(5 * 4096, 4096).code() == tier::Code::kInvalidArgument);
  CHECK(a.used_bytes() == 2 * 4096u);
  auto y = a.allocate(4 * 4096);  // [0,4) is the only 4-page hole
  REQUIRE(y);
  CHECK(*y == 0);
}

TEST_CASE("extent allocator: random churn never hands out overlapping ranges") {
  ExtentAllocator a(4096, 32 * 4096);
  const uint64_t pages = 256;
  REQUIRE(a.add_range(0, pages * 4096).is_ok());
  std::vector<int> owner(pages, -1);
  std::map<int, std::pair<uint64_t, uint64_t>> live;
  std::mt19937_64 g(42);
  int next = 0;
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || g() % 3 != 0) {
      uint64_t len = (g() % 8 + 1) * 4096;
      auto off = a.allocate(len);
      if (!off) continue;
      for (uint64_t p = *off / 4096; p < (*off + len) / 4096; ++p) {
        REQUIRE(owner[p] == -1);
        owner[p] = next;
      }
      live[next++] = {*off, len};
      used += len;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(g() % live.size()));
      auto [off, len] = it->second;
      for (uint64_t p = off / 4096; p < (off + len) / 4096; ++p) owner[p] = -1;
      REQUIRE(a.release(off, len).is_ok());
      used -= len;
      live.erase(it);
    }
    REQUIRE(a.used_bytes() == used);
  }
}
