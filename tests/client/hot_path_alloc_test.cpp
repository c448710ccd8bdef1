// The lease hot path (lease + release of one tensor on a warm Client) must not touch the heap:
// this binary replaces global operator new to count allocations program-wide, libtier included.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

namespace {
std::atomic<uint64_t> g_allocs{0};
}

// Every plain (non-aligned) form is replaced, so whatever allocates with one frees with ours.
namespace {
void* counted_alloc(std::size_t n) noexcept {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

TEST_CASE("a warm lease + release of one tensor does not allocate") {
  tier::test::TestDaemon d;
  auto c = tier::Client::connect(d.socket());
  REQUIRE(c.has_value());
  tier::Client& client = **c;
  REQUIRE(client.create_pool("p", {.ram_quota = 16 << 20}).has_value());
  tier::TensorDesc desc;
  desc.name = "t";
  desc.size = 4096;
  auto t = client.create_tensor("p", desc);
  REQUIRE(t.has_value());
  for (int i = 0; i < 10; ++i) {  // warm up: arena mapped, buffers grown
    auto l = client.lease(t->id, tier::LeaseMode::kWrite);
    REQUIRE(l.has_value());
  }
  uint64_t before = g_allocs.load();
  bool all_ok = true;
  for (int i = 0; i < 1000; ++i) {
    auto l = client.lease(t->id, i % 2 ? tier::LeaseMode::kRead : tier::LeaseMode::kWrite);
    all_ok &= l.has_value() && l->release().is_ok();
  }
  uint64_t allocs = g_allocs.load() - before;
  CHECK(all_ok);
  CHECK(allocs == 0);
  // The counter does see libtier's allocations (list_pools builds a vector of strings).
  before = g_allocs.load();
  CHECK(client.list_pools().has_value());
  CHECK(g_allocs.load() > before);
  CHECK(client.drop_pool("p").is_ok());
}
