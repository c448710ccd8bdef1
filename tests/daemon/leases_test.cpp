#include <catch2/catch.hpp>

#include "leases/lease_table.hpp"

using namespace tier;
using namespace tier::daemon;

namespace {
struct Fixture {
  Catalog cat;
  Pool* pool = nullptr;
  std::vector<Tensor*> t;
  LeaseTable table;
  SessionLeases s1{1}, s2{2};
  Fixture() {
    pool = *cat.create_pool("job", 0, 1 << 30, 0);
    for (int i = 0; i < 4; ++i) {
      TensorDesc d;
      d.name = "t" + std::to_string(i);
      d.size = 4096;
      t.push_back(*cat.create_tensor(*pool, d, 0));
    }
  }
  Status lease(SessionLeases& s, LeaseMode m, std::vector<Tensor*> ts, std::vector<uint64_t>* ids = nullptr) {
    std::vector<uint64_t> tmp;
    return table.acquire(s, m, ts, cat, ids ? *ids : tmp);
  }
};
}  // namespace

TEST_CASE("leases: readers share, a writer excludes") {
  Fixture f;
  std::vector<uint64_t> r1, r2;
  REQUIRE(f.lease(f.s1, LeaseMode::kRead, {f.t[0]}, &r1));
  REQUIRE(f.lease(f.s2, LeaseMode::kRead, {f.t[0]}, &r2));
  CHECK(f.t[0]->readers == 2);
  auto w = f.lease(f.s2, LeaseMode::kWrite, {f.t[0]});
  CHECK(w.code() == Code::kBusy);
  REQUIRE(f.table.release(f.s1, r1[0], f.cat));
  REQUIRE(f.table.release(f.s2, r2[0], f.cat));
  std::vector<uint64_t> wid;
  REQUIRE(f.lease(f.s1, LeaseMode::kWrite, {f.t[0]}, &wid));
  CHECK(f.t[0]->writer);
  CHECK(f.lease(f.s2, LeaseMode::kRead, {f.t[0]}).code() == Code::kBusy);
  CHECK(f.lease(f.s1, LeaseMode::kWrite, {f.t[0]}).code() == Code::kBusy);  // even the holder
  CHECK(f.pool->leases == 1);
  REQUIRE(f.table.release(f.s1, wid[0], f.cat));
  CHECK_FALSE(f.t[0]->writer);
  CHECK(f.pool->leases == 0);
  CHECK(f.table.live() == 0);
}

TEST_CASE("leases: batches are all or nothing") {
  Fixture f;
  std::vector<uint64_t> w;
  REQUIRE(f.lease(f.s1, LeaseMode::kWrite, {f.t[2]}, &w));
  std::vector<uint64_t> ids;
  CHECK(f.lease(f.s2, LeaseMode::kWrite, {f.t[0], f.t[1], f.t[2], f.t[3]}, &ids).code() == Code::kBusy);
  CHECK(ids.empty());
  CHECK_FALSE(f.t[0]->writer);
  CHECK_FALSE(f.t[1]->writer);
  CHECK(f.s2.count == 0);
  CHECK(f.lease(f.s2, LeaseMode::kWrite, {f.t[0], f.t[0]}).code() == Code::kInvalidArgument);
  std::vector<Tensor*> big;
  for (int i = 0; i < 40; ++i) big.push_back(f.t[static_cast<size_t>(i % 2)]);
  CHECK(f.lease(f.s2, LeaseMode::kWrite, big).code() == Code::kInvalidArgument);
  CHECK(f.s2.count == 0);
  std::vector<uint64_t> rr;
  REQUIRE(f.lease(f.s2, LeaseMode::kRead, {f.t[0], f.t[0], f.t[1]}, &rr));  // reads may repeat
  CHECK(rr.size() == 3);
  CHECK(f.t[0]->readers == 2);
}

TEST_CASE("leases: ownership, stale ids and session close") {
  Fixture f;
  std::vector<uint64_t> a, b;
  REQUIRE(f.lease(f.s1, LeaseMode::kRead, {f.t[0], f.t[1]}, &a));
  REQUIRE(f.lease(f.s2, LeaseMode::kWrite, {f.t[2], f.t[3]}, &b));
  CHECK(f.table.release(f.s2, a[0], f.cat).code() == Code::kNotFound);  // not s2's
  CHECK(f.table.find(a[0])->session_id == 1);
  CHECK(f.table.release_all(f.s1, f.cat) == 2);
  CHECK(f.s1.count == 0);
  CHECK(f.t[0]->readers == 0);
  CHECK(f.table.release(f.s1, a[0], f.cat).code() == Code::kNotFound);  // already gone
  // The slot is reused with a new generation: the old id stays dead.
  std::vector<uint64_t> c;
  REQUIRE(f.lease(f.s1, LeaseMode::kRead, {f.t[0]}, &c));
  CHECK(c[0] != a[0]);
  CHECK(f.table.find(a[0]) == nullptr);
  CHECK(f.table.find(a[1]) == nullptr);
  CHECK(f.table.live() == 3);
  CHECK(f.table.release_all(f.s2, f.cat) == 2);
  CHECK_FALSE(f.t[2]->writer);
  // Releasing in the middle of a session's list keeps the list intact.
  std::vector<uint64_t> many;
  REQUIRE(f.lease(f.s2, LeaseMode::kRead, {f.t[0], f.t[1], f.t[2], f.t[3]}, &many));
  REQUIRE(f.table.release(f.s2, many[2], f.cat));
  REQUIRE(f.table.release(f.s2, many[0], f.cat));
  CHECK(f.table.release_all(f.s2, f.cat) == 2);
  CHECK(f.t[1]->readers == 0);
}

TEST_CASE("leases: waiters keep FIFO order and expire at their deadline") {
  LeaseTable table;
  auto now = Clock::now();
  table.add_waiter(Waiter{1, 10, LeaseMode::kRead, {1}, now + std::chrono::milliseconds(100)});
  table.add_waiter(Waiter{2, 20, LeaseMode::kRead, {1}, Clock::time_point::max()});
  table.add_waiter(Waiter{3, 30, LeaseMode::kRead, {1}, now + std::chrono::milliseconds(50)});
  CHECK(table.next_deadline() == now + std::chrono::milliseconds(50));
  std::vector<uint32_t> order;
  table.retry_waiters([&](Waiter& w) {
    order.push_back(w.request_id);
    return w.request_id == 20;
  });
  CHECK(order == std::vector<uint32_t>{10, 20, 30});
  CHECK(table.waiter_count() == 2);
  std::vector<uint32_t> expired;
  table.expire_waiters(now + std::chrono::milliseconds(60),
                       [&](Waiter& w) { expired.push_back(w.request_id); });
  CHECK(expired == std::vector<uint32_t>{30});
  table.drop_waiters(1);
  CHECK(table.waiter_count() == 0);
  CHECK_FALSE(table.next_deadline());
}

TEST_CASE("catalog: a pool of 1M tensors; lookups by id and name") {
  Catalog cat;
  Pool* p = *cat.create_pool("big", 0, 1ull << 40, 0);
  constexpr uint64_t kN = 1'000'000;
  uint64_t created = 0;
  for (uint64_t i = 0; i < kN; ++i) {
    TensorDesc d;
    d.name = std::to_string(i);
    d.size = 4096;
    created += cat.create_tensor(*p, std::move(d), 0).has_value();
  }
  REQUIRE(created == kN);
  CHECK(cat.tensor_count() == kN);
  CHECK(p->tensors.size() == kN);
  for (uint64_t id = 1; id <= kN; id += 9973) {
    Tensor* t = cat.find_tensor(id);
    REQUIRE(t);
    CHECK(t->name == std::to_string(id - 1));
    CHECK(cat.find_tensor(*p, t->name) == t);
  }
  CHECK(p->tensors.upper_bound(kN - 3)->first == kN - 2);
  cat.erase_tensor(*p, 500);
  CHECK(cat.find_tensor(500) == nullptr);
  CHECK(cat.find_tensor(*p, "499") == nullptr);
  cat.erase_pool(p->id);
  CHECK(cat.tensor_count() == 0);
  CHECK(cat.next_tensor_id() == kN + 1);  // ids are never reused
}

TEST_CASE("leases: transfer moves a lease to another session under a new id, and ends are reported") {
  Fixture f;
  std::vector<uint64_t> ended;
  f.table.on_write_end = [&](const LeaseTable::Lease& l) { ended.push_back(l.tensor_id); };
  std::vector<uint64_t> w, r;
  REQUIRE(f.lease(f.s1, LeaseMode::kWrite, {f.t[0]}, &w));
  REQUIRE(f.lease(f.s1, LeaseMode::kRead, {f.t[1]}, &r));
  auto moved = f.table.transfer(f.s1, f.s2, w[0]);
  REQUIRE(moved.has_value());
  CHECK(*moved != w[0]);
  CHECK(f.table.find(w[0]) == nullptr);  // the old id is stale
  REQUIRE(f.table.find(*moved));
  CHECK(f.table.find(*moved)->session_id == 2);
  CHECK(f.t[0]->writer);  // the tensor stayed write-leased throughout
  CHECK(ended.empty());   // a transfer is no end
  CHECK(f.s1.count == 1);
  CHECK(f.s2.count == 1);
  CHECK(f.table.live() == 2);
  CHECK(f.table.transfer(f.s1, f.s2, *moved).error().code() == Code::kNotFound);  // not s1's
  CHECK(f.table.release(f.s1, *moved, f.cat).code() == Code::kNotFound);
  REQUIRE(f.table.release(f.s2, *moved, f.cat));
  CHECK_FALSE(f.t[0]->writer);
  CHECK(ended == std::vector<uint64_t>{f.t[0]->id});
  REQUIRE(f.table.release(f.s1, r[0], f.cat));  // a read lease's end is not reported
  CHECK(ended.size() == 1);
  REQUIRE(f.lease(f.s2, LeaseMode::kOverwrite, {f.t[2], f.t[3]}));
  CHECK(f.table.release_all(f.s2, f.cat) == 2);
  CHECK(ended.size() == 3);
}
