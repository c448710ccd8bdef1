// The request handler with a real NVMe tier, driven synchronously (no sockets, no event loop):
// I/O completes only when the test calls tier_poll(), so interleavings are the same on every
// run. Plans (their limits, leases racing their prefetches) and leases that need write-backs
// (the handler must defer them, never wait for the device inside a request).
//
// The case it pins down: a lease whose tensors are all in RAM is granted right after the plan
// cursor advances, and advancing it starts prefetches that evict clean tensors used farthest
// ahead. The tensor just leased (its next use is a whole cycle away) is exactly such a victim;
// it must stay in RAM until its grant, and every grant must show its last committed bytes.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "ram/arena.hpp"
#include "rpc/request_handler.hpp"
#include "support/handler_harness.hpp"

using namespace tier;
using namespace tier::daemon;
using namespace tier::wire;

namespace {

// A temporary NVMe directory, made before (and removed after) the handler that uses it.
struct TempNvmeDir {
  std::string path;
  TempNvmeDir() {
    char tmpl[] = "/tmp/tierd-nvme.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempNvmeDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// One session on a handler with an NVMe tier and RAM watermarks at 1.0: no background
// eviction, so the tier runs full and every prefetch must evict to find room (with the default
// watermarks it would mostly find free space and never race a lease).
struct Harness : TempNvmeDir, tier::test::HandlerHarness {
  std::unique_ptr<Session> s;

  explicit Harness(uint64_t ram, uint32_t max_plan_uses = 4096)
      : HandlerHarness(config(path, max_plan_uses), ResolvedSizes{ram, ram, 2ull << 20}) {
    s = session(::getuid(), true);
  }
  ~Harness() { handler->session_closed(*s); }
  template <class Rep, class Req> Result<Rep> call(MsgType t, const Req& req) {
    return call_waiting<Rep>(*s, t, req);
  }
  // Creates tensor `name` of `size` bytes in `pool` and stamps it with `seed` under a write
  // lease; returns its id.
  uint64_t create_stamped(const std::string& pool, const std::string& name, uint64_t size, uint64_t seed);

  static Config config(const std::string& nvme, uint32_t max_plan_uses) {
    Config cfg;
    cfg.topology = "synthetic:pack:1 numa:1 core:1 pu:1";
    cfg.nvme.push_back(NvmeDir{nvme, -1});
    cfg.ram_high_watermark = 1.0;
    cfg.ram_low_watermark = 1.0;
    cfg.max_plan_uses = max_plan_uses;
    return cfg;
  }
};

// A tensor's identity and version, stamped into one word per 4 KiB page: cheap enough that
// leases follow each other faster than a fetch completes (the point of the test), and a grant
// of the wrong extent, a zeroed page or a stale version all read back wrong.
void stamp(std::byte* p, size_t n, uint64_t seed) {
  for (size_t off = 0; off + 8 <= n; off += 4096) {
    const uint64_t w = seed * 0x9e3779b97f4a7c15ull + off;
    std::memcpy(p + off, &w, 8);
  }
}
bool stamped(const std::byte* p, size_t n, uint64_t seed) {
  for (size_t off = 0; off + 8 <= n; off += 4096) {
    uint64_t w;
    std::memcpy(&w, p + off, 8);
    if (w != seed * 0x9e3779b97f4a7c15ull + off) return false;
  }
  return true;
}

uint64_t Harness::create_stamped(const std::string& pool, const std::string& name, uint64_t size,
                                 uint64_t seed) {
  auto t = call<TensorInfoW>(MsgType::kTensorCreate, TensorCreateReq{pool, name, size, 0, {}, 0, -1, false});
  REQUIRE(t);
  auto l = call<LeaseRep>(MsgType::kLease, LeaseReq{2, -1, {t->id}});
  REQUIRE(l);
  stamp(at(l->grants[0]), size, seed);
  REQUIRE(call<Empty>(MsgType::kRelease, ReleaseReq{{l->grants[0].lease_id}}));
  return t->id;
}

// Pool "p" with a RAM quota of `ram` (the whole RAM tier), filled with ram / size dirty
// tensors t0, t1, ... stamped 100, 101, ...; returns their ids.
std::vector<uint64_t> fill_pool_with_dirty(Harness& h, uint64_t ram, uint64_t size) {
  REQUIRE(h.call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"p", ram, 0, false}));
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < ram / size; ++i)
    ids.push_back(h.create_stamped("p", "t" + std::to_string(i), size, 100 + i));
  return ids;
}

}  // namespace

TEST_CASE("leases under a plan's prefetches see their last committed bytes (deterministic)") {
  // Tensors large enough that a fetch takes longer than the gap between two leases: then the
  // prefetches a lease's cursor advance schedules are due at once, inside that lease.
  const int kTensors = 12;  // 96 MiB working set
  const uint64_t kSize = 8ull << 20;
  const uint64_t kRam = 48ull << 20;     // on a 48 MiB RAM tier
  const uint64_t kBudget = 40ull << 20;  // plan residency budget
  Harness h(kRam);
  REQUIRE(h.call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"plan", kRam, 0, false}));
  std::vector<uint64_t> ids, sizes, want;
  for (int i = 0; i < kTensors; ++i) {
    const uint64_t size = kSize - 4096 * i;
    ids.push_back(h.create_stamped("plan", "t" + std::to_string(i), size, 700 + i));
    want.push_back(700 + i);
    sizes.push_back(size);
  }
  // Everything written back and dropped: from here on every resident tensor is a clean copy,
  // which is what prefetches may evict without waiting.
  REQUIRE(h.call<Empty>(MsgType::kEvict, TensorIdsReq{"plan", {}}));
  REQUIRE(h.call<Empty>(MsgType::kPlanSet, PlanSetReq{"plan", ids, kBudget, {}}));

  int mismatches = 0, failures = 0;
  std::string first_failure;
  uint64_t seed = 10000;
  for (int cycle = 0; cycle < 10; ++cycle) {
    for (int i = 0; i < kTensors; ++i) {
      const bool write = (i + cycle) % 5 == 0;  // now and then a dirty copy, mostly clean ones
      auto l = h.call<LeaseRep>(MsgType::kLease, LeaseReq{uint8_t(write ? 2 : 1), -1, {ids[i]}});
      if (!l) {
        if (failures++ == 0) first_failure = l.error().to_string();
        continue;
      }
      std::byte* p = h.at(l->grants[0]);
      if (!stamped(p, sizes[i], want[i])) ++mismatches;
      if (write) {
        want[i] = ++seed;
        stamp(p, sizes[i], want[i]);
      }
      REQUIRE(h.call<Empty>(MsgType::kRelease, ReleaseReq{{l->grants[0].lease_id}}));
      h.handler->tier_poll();  // completions land between leases, as in the daemon's loop
    }
  }
  const TierStats& st = h.state->tiering->stats();
  INFO(st.prefetches << " prefetches, " << st.misses << " misses, " << st.evictions << " evictions; "
                     << first_failure);
  CHECK(failures == 0);
  CHECK(mismatches == 0);
  // The scenario really ran: RAM was too small, the plan prefetched and evicted.
  CHECK(st.prefetches > 0);
  CHECK(st.evictions > 0);
}

TEST_CASE("a plan longer than max_plan_uses, or with mismatched overwrite flags, is refused") {
  Harness h(16ull << 20, 8);
  REQUIRE(h.call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"p", 16ull << 20, 0, false}));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    auto t = h.call<TensorInfoW>(MsgType::kTensorCreate,
                                 TensorCreateReq{"p", "t" + std::to_string(i), 4096, 0, {}, 0, -1, false});
    REQUIRE(t);
    ids.push_back(t->id);
  }
  std::vector<uint64_t> eight{ids[0], ids[1], ids[2], ids[0], ids[1], ids[2], ids[0], ids[1]};
  CHECK(h.call<Empty>(MsgType::kPlanSet, PlanSetReq{"p", eight, 0, {}}));
  std::vector<uint64_t> nine = eight;
  nine.push_back(ids[2]);
  auto r = h.call<Empty>(MsgType::kPlanSet, PlanSetReq{"p", nine, 0, {}});
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == Code::kResourceExhausted);
  CHECK_THAT(r.error().message(), Catch::Contains("max_plan_uses"));
  auto bad = h.call<Empty>(MsgType::kPlanSet, PlanSetReq{"p", {ids[0], ids[1]}, 0, {1}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == Code::kInvalidArgument);
  CHECK(h.call<Empty>(MsgType::kPlanSet, PlanSetReq{"p", {ids[0], ids[1]}, 0, {1, 0}}));
}

TEST_CASE("a lease that needs a write-back first is deferred, not waited for inside the handler") {
  const uint64_t kRam = 8ull << 20, kSize = 2ull << 20;
  Harness h(kRam);
  std::vector<uint64_t> ids = fill_pool_with_dirty(h, kRam, kSize);
  REQUIRE(h.call<Empty>(MsgType::kEvict, TensorIdsReq{"p", {ids[0]}}));  // t0 only on NVMe now
  auto t4 =
      h.call<TensorInfoW>(MsgType::kTensorCreate, TensorCreateReq{"p", "t4", kSize, 0, {}, 0, -1, false});
  REQUIRE(t4);  // RAM full again, every resident copy dirty
  const uint64_t writebacks = h.state->tiering->stats().writebacks;

  // Lease t0: room needs a write-back. The handler starts it and defers the reply.
  std::vector<std::byte> req;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kLease), 9, LeaseReq{1, -1, {ids[0]}}, req));
  Reply r;
  h.handler->handle(*h.s, req, r);
  REQUIRE(r.deferred);
  CHECK(h.state->tiering->stats().writebacks == writebacks);  // not waited for in the handler
  CHECK(h.state->tiering->engine().pending() > 0);
  // Meanwhile the handler answers others at once (a status request here).
  auto st = h.call<StatusRep>(MsgType::kStatus, Empty{});
  CHECK(st);

  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.deferred.empty() && std::chrono::steady_clock::now() < until) {
    h.handler->tier_poll();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  REQUIRE(h.deferred.size() == 1);
  auto hdr = parse_header(h.deferred[0].second);
  REQUIRE(hdr);
  auto grant = decode_reply<LeaseRep>(payload_of(h.deferred[0].second));
  REQUIRE(grant);
  CHECK(stamped(h.at(grant->grants[0]), kSize, 100));
  CHECK(h.state->tiering->stats().writebacks > writebacks);
}

TEST_CASE(
    "a create that needs a write-back first is answered at once, the tensor in no tier until its first "
    "lease") {
  const uint64_t kRam = 8ull << 20, kSize = 2ull << 20;
  Harness h(kRam);
  std::vector<uint64_t> ids = fill_pool_with_dirty(h, kRam, kSize);
  const uint64_t writebacks = h.state->tiering->stats().writebacks;

  // Room for t4 needs a write-back: the handler starts one, does not wait for it, and answers.
  std::vector<std::byte> req;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kTensorCreate), 9,
                 TensorCreateReq{"p", "t4", kSize, 0, {}, 0, -1, false}, req));
  Reply r;
  h.handler->handle(*h.s, req, r);
  REQUIRE_FALSE(r.deferred);
  auto t4 = decode_reply<TensorInfoW>(payload_of(r.bytes));
  REQUIRE(t4);
  CHECK(t4->tiers == 0);  // in no tier: nothing to write back, nothing to read
  CHECK(h.state->tiering->stats().writebacks == writebacks);
  CHECK(h.state->tiering->engine().pending() > 0);

  // Its first lease waits for the room (deferred, not blocking), then sees zeros.
  auto l = h.call<LeaseRep>(MsgType::kLease, LeaseReq{2, -1, {t4->id}});
  REQUIRE(l);
  const std::byte* p = h.at(l->grants[0]);
  CHECK(std::all_of(p, p + kSize, [](std::byte b) { return b == std::byte{0}; }));
  stamp(h.at(l->grants[0]), kSize, 104);
  REQUIRE(h.call<Empty>(MsgType::kRelease, ReleaseReq{{l->grants[0].lease_id}}));
  CHECK(h.state->tiering->stats().writebacks > writebacks);

  // Every tensor keeps its bytes: the ones written back and read again, and the new one.
  ids.push_back(t4->id);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto g = h.call<LeaseRep>(MsgType::kLease, LeaseReq{1, -1, {ids[i]}});
    REQUIRE(g);
    CHECK(stamped(h.at(g->grants[0]), kSize, 100 + i));
    REQUIRE(h.call<Empty>(MsgType::kRelease, ReleaseReq{{g->grants[0].lease_id}}));
  }
}
