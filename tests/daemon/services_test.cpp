// LeaseService and PoolService driven directly on a real DaemonState, without the request
// handler's decoding: the rules themselves (quotas, grants, waits, retries, deadlines).
#include <catch2/catch.hpp>

#include "leases/lease_service.hpp"
#include "pools/pool_service.hpp"
#include "support/handler_harness.hpp"

using namespace tier;
using namespace tier::daemon;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

struct Fixture : tier::test::HandlerHarness {
  explicit Fixture(ResolvedSizes sizes = {256 * kMiB, 64 * kMiB, 2 * kMiB})
      : HandlerHarness(config(), sizes), pools(state->pool_parts()), leases(state->lease_parts()) {
    leases.set_deferred_sink([this](uint64_t sid, std::span<const std::byte> b) {
      sunk.emplace_back(sid, std::vector<std::byte>(b.begin(), b.end()));
    });
  }
  static Config config() {
    Config cfg;
    cfg.topology = "synthetic:pack:1 numa:1 core:1 pu:1";
    return cfg;
  }
  std::unique_ptr<Session> open(uid_t uid) {
    auto s = std::make_unique<Session>();
    s->id = next_session++;
    s->uid = uid;
    s->gid = uid;
    s->hello = true;
    leases.session_opened(*s);
    return s;
  }
  Tensor* tensor(Pool& p, const std::string& name, uint64_t size = kMiB) {
    wire::TensorCreateReq req;
    req.pool = p.name;
    req.name = name;
    req.size = size;
    auto t = pools.create_tensor(p, req, -1);
    REQUIRE(t);
    return *t;
  }
  // Pool "p" of uid 0 with one 1 MiB tensor "w" in RAM.
  Tensor* one_tensor() {
    auto p = pools.create_pool(0, wire::PoolCreateReq{"p"});
    REQUIRE(p);
    return tensor(**p, "w");
  }
  static wire::LeaseReq lease_req(LeaseMode m, int32_t timeout_ms, uint64_t id) {
    return wire::LeaseReq{static_cast<uint8_t>(m), timeout_ms, {id}};
  }
  // The status a deferred lease reply carries, and its grants.
  static Result<wire::LeaseRep> decode(const std::vector<std::byte>& bytes) {
    return wire::decode_reply<wire::LeaseRep>(wire::payload_of(bytes));
  }

  PoolService pools;
  LeaseService leases;
  std::vector<std::pair<uint64_t, std::vector<std::byte>>> sunk;
};

}  // namespace

TEST_CASE("pool service: RAM quota, group access and the per-uid NVMe reservation") {
  Fixture f(ResolvedSizes{256 * kMiB, 64 * kMiB, 2 * kMiB, 0, 100 * kMiB});
  wire::PoolCreateReq big{"big", 512 * kMiB};
  auto r = f.pools.create_pool(1000, big);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == Code::kResourceExhausted);
  CHECK(r.error().message().find("exceeds the RAM tier") != std::string::npos);

  wire::PoolCreateReq grp{"grp"};
  grp.group_read = true;
  auto g = f.pools.create_pool(1000, grp);
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == Code::kInvalidArgument);

  // 60 MiB reserved of the uid's 100; 0 takes a quarter of the uid's quota (25), not all that
  // is left; 16 more do not fit the 15 left; a last 0 takes those 15; then nothing is left.
  auto a = f.pools.create_pool(1000, wire::PoolCreateReq{"a", 0, 60 * kMiB});
  REQUIRE(a);
  CHECK((*a)->ram_quota == 64 * kMiB);  // the node's default pool quota
  auto b = f.pools.create_pool(1000, wire::PoolCreateReq{"b", 0, 0});
  REQUIRE(b);
  CHECK((*b)->nvme_quota == 25 * kMiB);
  auto c = f.pools.create_pool(1000, wire::PoolCreateReq{"c", 0, 16 * kMiB});
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == Code::kResourceExhausted);
  CHECK(c.error().message().find("uid_nvme_quota") != std::string::npos);
  auto e = f.pools.create_pool(1000, wire::PoolCreateReq{"e", 0, 0});
  REQUIRE(e);
  CHECK((*e)->nvme_quota == 15 * kMiB);
  CHECK_FALSE(f.pools.create_pool(1000, wire::PoolCreateReq{"f", 0, 0}));
  // Root is not limited by it.
  CHECK(f.pools.create_pool(0, wire::PoolCreateReq{"r", 0, 200 * kMiB}));
  // Another uid has its own reservation.
  CHECK(f.pools.create_pool(1001, wire::PoolCreateReq{"d", 0, 100 * kMiB}));
}

TEST_CASE("pool service: tensors take RAM from their pool and give it back") {
  Fixture f;
  auto p = f.pools.create_pool(0, wire::PoolCreateReq{"p", 8 * kMiB});
  REQUIRE(p);
  Pool& pool = **p;
  Tensor* t = f.tensor(pool, "w", 4 * kMiB);
  REQUIRE(t->ram);
  CHECK(pool_info(pool).ram_used == 4 * kMiB);
  // Over the pool's quota: refused at create, nothing allocated.
  wire::TensorCreateReq more;
  more.pool = "p";
  more.name = "x";
  more.size = 6 * kMiB;
  auto x = f.pools.create_tensor(pool, more, -1);
  REQUIRE_FALSE(x);
  CHECK(x.error().code() == Code::kResourceExhausted);
  CHECK(pool_info(pool).ram_used == 4 * kMiB);
  f.pools.erase_tensor(pool, *t);
  CHECK(pool_info(pool).ram_used == 0);
  CHECK(pool.tensors.empty());
  f.pools.drop_pool(pool, 0);
  CHECK(f.state->catalog.find_pool("p") == nullptr);
}

TEST_CASE("lease service: a wait is granted when the conflicting lease is released") {
  Fixture f;
  Tensor* t = f.one_tensor();
  auto writer = f.open(0), reader = f.open(0);

  std::vector<std::byte> reply;
  auto w = f.leases.request(*writer, 1, Fixture::lease_req(LeaseMode::kWrite, 0, t->id), reply);
  REQUIRE(w.status.is_ok());
  CHECK_FALSE(w.deferred);
  auto granted = Fixture::decode(reply);
  REQUIRE(granted);
  REQUIRE(granted->grants.size() == 1);
  const uint64_t write_lease = granted->grants[0].lease_id;

  // Fail fast: kBusy at once. With a timeout: deferred, nothing sent yet.
  reply.clear();
  auto busy = f.leases.request(*reader, 2, Fixture::lease_req(LeaseMode::kRead, 0, t->id), reply);
  CHECK(busy.status.code() == Code::kBusy);
  auto waits = f.leases.request(*reader, 3, Fixture::lease_req(LeaseMode::kRead, 5000, t->id), reply);
  REQUIRE(waits.status.is_ok());
  CHECK(waits.deferred);
  CHECK(reader->waiting == 1);
  CHECK(f.sunk.empty());

  // Releasing someone else's lease is refused, all or nothing.
  CHECK(f.leases.release(*reader, std::vector<uint64_t>{write_lease}).code() == Code::kNotFound);
  CHECK(f.sunk.empty());
  REQUIRE(f.leases.release(*writer, std::vector<uint64_t>{write_lease}).is_ok());
  REQUIRE(f.sunk.size() == 1);
  CHECK(f.sunk[0].first == reader->id);
  auto late = Fixture::decode(f.sunk[0].second);
  REQUIRE(late);
  REQUIRE(late->grants.size() == 1);
  CHECK(late->grants[0].tensor_id == t->id);
  CHECK(reader->waiting == 0);
  CHECK(t->readers == 1);
}

TEST_CASE("lease service: a wait past its deadline is answered kTimeout") {
  Fixture f;
  Tensor* t = f.one_tensor();
  auto a = f.open(0), b = f.open(0);
  std::vector<std::byte> reply;
  REQUIRE(f.leases.request(*a, 1, Fixture::lease_req(LeaseMode::kWrite, 0, t->id), reply).status.is_ok());
  auto waits = f.leases.request(*b, 2, Fixture::lease_req(LeaseMode::kWrite, 10, t->id), reply);
  REQUIRE(waits.deferred);
  f.leases.expire(Clock::now() + std::chrono::seconds(1));
  REQUIRE(f.sunk.size() == 1);
  auto r = Fixture::decode(f.sunk[0].second);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == Code::kTimeout);
  CHECK(f.state->counters.lease_timeouts == 1);
  CHECK(b->waiting == 0);
  // A closed session's waiters and leases go with it.
  CHECK(f.leases.session_closed(*a));
  CHECK(t->writer == false);
}

TEST_CASE("lease service: requests it must refuse") {
  Fixture f;
  Tensor* t = f.one_tensor();
  auto s = f.open(0), other = f.open(1234);
  std::vector<std::byte> reply;
  CHECK(f.leases.request(*s, 1, wire::LeaseReq{9, 0, {t->id}}, reply).status.code() ==
        Code::kInvalidArgument);
  CHECK(f.leases.request(*s, 1, wire::LeaseReq{1, 0, {}}, reply).status.code() == Code::kInvalidArgument);
  std::vector<uint64_t> too_many(LeaseService::max_grants() + 1, t->id);
  CHECK(f.leases.request(*s, 1, wire::LeaseReq{1, 0, too_many}, reply).status.code() ==
        Code::kInvalidArgument);
  CHECK(f.leases.request(*s, 1, Fixture::lease_req(LeaseMode::kRead, 0, 999999), reply).status.code() ==
        Code::kNotFound);
  // Another uid without a group grant may not read the pool.
  CHECK(f.leases.request(*other, 1, Fixture::lease_req(LeaseMode::kRead, 0, t->id), reply).status.code() ==
        Code::kPermissionDenied);
  CHECK(t->readers == 0);
}
