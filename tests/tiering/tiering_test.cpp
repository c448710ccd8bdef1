// The NVMe tier inside a real tierd, through libtier: spill and fetch under churn, eviction
// and prefetch by hand, corruption and quota errors, the tmpfs fallback, and plans.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "support/daemon_fixture.hpp"
#include "support/tier_test_util.hpp"
#include "tier/client.hpp"

using namespace tier;
using namespace tier::test;
namespace fs = std::filesystem;

namespace {

NodeStatus status_of(Client& c) {
  auto s = c.status();
  REQUIRE(s);
  return *s;
}

uint8_t tiers_of(Client& c, const std::string& pool, const std::string& name) {
  auto t = c.open_tensor(pool, name);
  REQUIRE(t);
  return t->tiers;
}

}  // namespace

TEST_CASE("content survives churn with RAM at a quarter of the working set") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "16M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("churn"));
  std::mt19937_64 rng(42);
  const int kTensors = 40;  // random sizes 64 KiB .. 3 MiB: about 64 MiB in all
  std::vector<uint64_t> ids, hashes;
  uint64_t total = 0;
  for (int i = 0; i < kTensors; ++i) {
    uint64_t size = 65536 + rng() % (3u << 20) + (rng() % 2 ? 0 : rng() % 4096);  // odd sizes too
    auto t = c->create_tensor("churn", desc("t" + std::to_string(i), size));
    REQUIRE(t);
    ids.push_back(t->id);
    hashes.push_back(write_tensor(*c, t->id, rng()));
    total += size;
  }
  CHECK(total > 3 * (16u << 20));
  for (int op = 0; op < 250; ++op) {
    size_t k = rng() % ids.size();
    if (rng() % 3 == 0) {
      hashes[k] = write_tensor(*c, ids[k], rng());
    } else {
      INFO("tensor " << k << " op " << op);
      REQUIRE(read_hash(*c, ids[k]) == hashes[k]);
    }
    if (op % 50 == 49) REQUIRE(c->evict("churn").is_ok());
  }
  for (size_t k = 0; k < ids.size(); ++k) REQUIRE(read_hash(*c, ids[k]) == hashes[k]);
  NodeStatus s = status_of(*c);
  REQUIRE(s.ram.size() >= 1);
  REQUIRE(s.nvme.size() == 1);
  CHECK(s.nvme[0].backend == "io_uring");
  CHECK(s.ram[0].used <= s.ram[0].capacity);
  CHECK(s.misses > 0);
  CHECK(s.evictions > 0);
  CHECK(s.bytes_read > 0);
  CHECK(s.bytes_written > 0);
}

TEST_CASE("evict then lease brings a tensor back bit-exact; prefetch then lease is a hit") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto t = c->create_tensor("p", desc("w", (1u << 20) + 123));
  REQUIRE(t);
  uint64_t h = write_tensor(*c, t->id, 7);
  CHECK(tiers_of(*c, "p", "w") == kTierRam);

  uint64_t id = t->id;
  REQUIRE(c->evict("p", {&id, 1}).is_ok());
  CHECK(tiers_of(*c, "p", "w") == kTierNvme);
  NodeStatus s0 = status_of(*c);
  CHECK(s0.ram[0].used == 0);
  CHECK(s0.nvme[0].used >= (1u << 20));
  CHECK(read_hash(*c, id) == h);
  NodeStatus s1 = status_of(*c);
  CHECK(s1.misses == s0.misses + 1);
  CHECK(s1.stalls == s0.stalls + 1);
  CHECK(tiers_of(*c, "p", "w") == (kTierRam | kTierNvme));  // a clean copy on both
  auto m = c->metrics();
  REQUIRE(m);
  CHECK_THAT(*m, Catch::Contains("tierd_misses_total 1\n"));
  CHECK_THAT(*m, Catch::Contains("tierd_stall_seconds_total "));
  CHECK_THAT(*m, Catch::Contains("tierd_fetches_total 1\n"));

  // Clean now: evicting drops it without writing again.
  REQUIRE(c->evict("p").is_ok());
  CHECK(status_of(*c).bytes_written == s1.bytes_written);
  REQUIRE(c->prefetch("p", {&id, 1}).is_ok());
  for (int i = 0; i < 500 && !(tiers_of(*c, "p", "w") & kTierRam); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE((tiers_of(*c, "p", "w") & kTierRam) != 0);
  NodeStatus s2 = status_of(*c);
  CHECK(read_hash(*c, id) == h);
  NodeStatus s3 = status_of(*c);
  CHECK(s3.hits == s2.hits + 1);
  CHECK(s3.misses == s2.misses);
  CHECK(s3.prefetches >= 1);

  // A leased tensor is not evicted; naming it says so.
  auto l = c->lease(id, LeaseMode::kRead);
  REQUIRE(l);
  Status st = c->evict("p", {&id, 1});
  CHECK(st.code() == Code::kBusy);
  CHECK(fnv(l->bytes()) == h);
  REQUIRE(l->release().is_ok());
}

// Reads one counter from the Prometheus text (metric lines are "name value").
uint64_t metric_value(Client& c, const std::string& name) {
  auto m = c.metrics();
  REQUIRE(m);
  size_t at = m->find("\n" + name + " ");
  REQUIRE(at != std::string::npos);
  return std::stoull(m->substr(at + name.size() + 2));
}

TEST_CASE("an overwrite lease on a tensor only on NVMe gets RAM without reading it back") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto a = c->create_tensor("p", desc("a", 4u << 20));
  auto b = c->create_tensor("p", desc("b", (3u << 20) + 17));
  REQUIRE(a);
  REQUIRE(b);
  write_tensor(*c, a->id, 1);
  write_tensor(*c, b->id, 2);
  uint64_t bid = b->id;
  REQUIRE(c->evict("p", {&bid, 1}).is_ok());
  REQUIRE(tiers_of(*c, "p", "b") == kTierNvme);
  NodeStatus s0 = status_of(*c);

  SECTION("alone: granted at once, no read, and the new bytes survive a later eviction") {
    auto l = c->lease(bid, LeaseMode::kOverwrite);  // fail-fast: no wait for I/O either
    REQUIRE(l);
    CHECK(l->mode() == LeaseMode::kOverwrite);
    CHECK(l->bytes().size() == b->size);
    NodeStatus s1 = status_of(*c);
    CHECK(s1.bytes_read == s0.bytes_read);
    CHECK(s1.misses == s0.misses);
    CHECK(metric_value(*c, "tierd_fetches_skipped_total") == 1);
    // Exclusive like a write lease.
    CHECK(c->lease(bid, LeaseMode::kRead).error().code() == Code::kBusy);
    fill(l->bytes(), 99);
    uint64_t h = fnv(l->bytes());
    REQUIRE(l->release().is_ok());
    CHECK(read_hash(*c, bid) == h);
    REQUIRE(c->evict("p", {&bid, 1}).is_ok());
    CHECK(tiers_of(*c, "p", "b") == kTierNvme);
    CHECK(read_hash(*c, bid) == h);  // written back, then fetched: the overwrite, not seed 2
    CHECK(status_of(*c).bytes_read > s0.bytes_read);
  }

  SECTION("with a conflicting lease in the batch it places nothing until it can be granted") {
    auto held = c->lease(a->id, LeaseMode::kRead);
    REQUIRE(held);
    std::vector<uint64_t> both{bid, a->id};
    auto busy = c->lease_batch(both, LeaseMode::kOverwrite);
    REQUIRE_FALSE(busy);
    CHECK(busy.error().code() == Code::kBusy);
    // b was read back like a write lease's tensor (never left unleased with unspecified bytes).
    CHECK(metric_value(*c, "tierd_fetches_skipped_total") == 0);
    CHECK(read_hash(*c, bid) == fnv([&] {
            std::vector<std::byte> v(b->size);
            fill(v, 2);
            return v;
          }()));
    REQUIRE(held->release().is_ok());
    REQUIRE(c->evict("p", {&bid, 1}).is_ok());
    auto ok = c->lease_batch(both, LeaseMode::kOverwrite);
    REQUIRE(ok);
    CHECK(metric_value(*c, "tierd_fetches_skipped_total") == 1);
    REQUIRE(c->release_batch(*ok).is_ok());
  }
}

TEST_CASE("discard lets a dirty tensor leave RAM without a write-back: its last written bytes, or zeros") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  const uint64_t size = (4u << 20) + 100;
  auto a = c->create_tensor("p", desc("a", size));
  auto b = c->create_tensor("p", desc("b", size));
  auto w = c->create_tensor("p", desc("w", size));
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(w);
  uint64_t aid = a->id, bid = b->id, wid = w->id;
  // a and w: one version written back to NVMe, then a newer one dirty in RAM. b: never written back.
  const uint64_t a1 = write_tensor(*c, aid, 1);
  const uint64_t w1 = write_tensor(*c, wid, 5);
  std::vector<uint64_t> aw{aid, wid};
  REQUIRE(c->evict("p", aw).is_ok());
  const uint64_t a2 = write_tensor(*c, aid, 2);
  const uint64_t b3 = write_tensor(*c, bid, 3);
  REQUIRE(a2 != a1);
  auto held = c->lease(wid, LeaseMode::kWrite);  // under a write lease: discard leaves it alone
  REQUIRE(held);
  fill(held->bytes(), 6);
  const uint64_t w6 = fnv(held->bytes());
  REQUIRE(w6 != w1);
  const uint64_t wb0 = metric_value(*c, "tierd_writebacks_total");
  std::vector<std::byte> zeros(size);
  const uint64_t z = fnv(zeros);

  std::vector<uint64_t> all{aid, bid, wid};
  REQUIRE(c->discard("p", all).is_ok());
  CHECK(metric_value(*c, "tierd_discarded_bytes_total") == 2 * size);  // a and b
  CHECK(read_hash(*c, aid) == a2);                                     // still in RAM: the current bytes
  CHECK(read_hash(*c, bid) == b3);
  REQUIRE(held->release().is_ok());
  REQUIRE(c->evict("p", all).is_ok());
  CHECK(metric_value(*c, "tierd_writebacks_total") == wb0 + 1);  // w only
  CHECK(tiers_of(*c, "p", "a") == kTierNvme);
  CHECK(tiers_of(*c, "p", "b") == 0);  // in no tier
  CHECK(read_hash(*c, wid) == w6);     // the write after the discard is kept

  SECTION("the older copy and zeros are what a lease reads") {
    const uint64_t skipped0 = metric_value(*c, "tierd_fetches_skipped_total");
    CHECK(read_hash(*c, aid) == a1);  // the last written-back version
    CHECK(read_hash(*c, bid) == z);   // nothing to fall back on: zeros, no read
    CHECK(metric_value(*c, "tierd_fetches_skipped_total") == skipped0 + 1);
    CHECK(tiers_of(*c, "p", "b") == kTierRam);
    // Zero-filled, b has no NVMe copy: leaving RAM again writes it back (it is not dead).
    REQUIRE(c->evict("p", {&bid, 1}).is_ok());
    CHECK(metric_value(*c, "tierd_writebacks_total") == wb0 + 2);
    CHECK(read_hash(*c, bid) == z);
  }
  SECTION("a write after the discard ends it: written back, not dropped") {
    const uint64_t b7 = write_tensor(*c, bid, 7);
    REQUIRE(c->discard("p", {&aid, 1}).is_ok());  // a is on NVMe only: nothing to save
    REQUIRE(c->evict("p", {&bid, 1}).is_ok());
    CHECK(metric_value(*c, "tierd_writebacks_total") == wb0 + 2);
    CHECK(read_hash(*c, bid) == b7);
  }
  SECTION("a prefetch or a plan does not stop at a tensor in no tier") {
    std::vector<uint64_t> ab{aid, bid};
    REQUIRE(c->prefetch("p", ab).is_ok());
    for (int i = 0; i < 500 && !(tiers_of(*c, "p", "a") & kTierRam); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK((tiers_of(*c, "p", "a") & kTierRam) != 0);
    CHECK(tiers_of(*c, "p", "b") == 0);  // nothing to read ahead
    REQUIRE(c->set_plan("p", ab).is_ok());
    CHECK(read_hash(*c, bid) == z);
  }
  SECTION("a restart finds the same fallback, and zeros") {
    REQUIRE(c->evict("p", {&aid, 1}).is_ok());
    c.reset();
    d.kill9();
    d.start();
    auto c2 = connect_to(d);
    CHECK(tiers_of(*c2, "p", "b") == 0);
    CHECK(read_hash(*c2, aid) == a1);
    CHECK(read_hash(*c2, bid) == z);
  }
  SECTION("errors: another pool's tensor, an empty list, an unknown pool") {
    REQUIRE(c->create_pool("q"));
    CHECK(c->discard("q", {&aid, 1}).code() == Code::kNotFound);
    CHECK(c->discard("nope", {&aid, 1}).code() == Code::kNotFound);
    CHECK(c->discard("p", {}).is_ok());  // nothing to send
  }
}

TEST_CASE("a dirty tensor overwritten next is held for its discard when its client discards it") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M", "ram_dirty_background = 1.0\n"));  // no writing ahead
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p", PoolOptions{.ram_quota = 16u << 20}));
  std::vector<uint64_t> ids;
  for (const char* n : {"x", "y", "z", "w"}) {
    auto t = c->create_tensor("p", desc(n, 4u << 20));
    REQUIRE(t);
    ids.push_back(t->id);
    write_tensor(*c, t->id, ids.size());
  }
  const bool discards = GENERATE(false, true);
  CAPTURE(discards);
  if (discards) {  // x was discarded once (a double buffer of an earlier step), then written again
    REQUIRE(c->discard("p", {&ids[0], 1}).is_ok());
    write_tensor(*c, ids[0], 9);
  }
  // x is overwritten next; y, z, w are read after it, w last. The pool is full: a new tensor
  // evicts one of them.
  std::vector<PlanUse> uses{{ids[0], true}, {ids[1], false}, {ids[2], false}, {ids[3], false}};
  REQUIRE(c->set_plan("p", uses).is_ok());
  const uint64_t wb0 = metric_value(*c, "tierd_writebacks_total");
  REQUIRE(c->create_tensor("p", desc("v", 4u << 20)));
  // The create does not wait for the victim's write-back (v starts in no tier meanwhile):
  // wait until the victim has an NVMe copy. Once it has left RAM, the pool has room again and
  // the plan may read a victim it uses later (w) back ahead of its use, so the victim is known
  // by its NVMe copy, not by its absence from RAM.
  auto written_back = [&] {
    for (const char* n : {"x", "y", "z", "w"})
      if (tiers_of(*c, "p", n) & kTierNvme) return true;
    return false;
  };
  for (int i = 0; i < 1000 && !written_back(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(written_back());
  CHECK(metric_value(*c, "tierd_writebacks_total") == wb0 + 1);
  CHECK(tiers_of(*c, "p", "y") == kTierRam);
  CHECK(tiers_of(*c, "p", "z") == kTierRam);
  if (discards) {
    CHECK(tiers_of(*c, "p", "x") == kTierRam);         // waits for its discard or overwrite
    CHECK((tiers_of(*c, "p", "w") & kTierNvme) != 0);  // the planned tensor read last
  } else {
    CHECK(tiers_of(*c, "p", "x") == kTierNvme);  // never read again by the plan: first, for good
    CHECK(tiers_of(*c, "p", "w") == kTierRam);
  }
}

TEST_CASE("an idle device writes planned tensors back ahead of need and keeps them in RAM") {
  TempDir nvme;
  // 64 MiB of tensors in 128 MiB (below the watermarks); background write-back above 16 MiB.
  TestDaemon d(nvme_opts(nvme.path, "128M", "ram_dirty_background = 0.125\n"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  REQUIRE(c->create_pool("q"));
  std::vector<uint64_t> planned, other, hashes;
  for (int i = 0; i < 8; ++i) {
    auto a = c->create_tensor("p", desc("a" + std::to_string(i), 4u << 20));
    auto b = c->create_tensor("q", desc("b" + std::to_string(i), 4u << 20));
    REQUIRE(a);
    REQUIRE(b);
    planned.push_back(a->id);
    other.push_back(b->id);
  }
  for (int i = 0; i < 8; ++i) {
    hashes.push_back(write_tensor(*c, planned[i], 100 + i));
    write_tensor(*c, other[i], 200 + i);  // q: no plan
  }
  // Nothing is written ahead without a plan.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (void)status_of(*c);
  CHECK(metric_value(*c, "tierd_cleaned_bytes_total") == 0);
  // p: read in order by a plan (cursor at a0); the last two uses overwrite a6, a7.
  std::vector<PlanUse> uses;
  uses.reserve(8);
  for (int i = 0; i < 8; ++i) uses.push_back({planned[i], i >= 6});
  REQUIRE(c->set_plan("p", uses).is_ok());
  // 32 MiB of planned tensors are dirty; six of them (24 MiB) are read later, above 16 MiB.
  // No further request is needed for it to start (the daemon looks again on its own timer).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  uint64_t cleaned = 0;
  for (int i = 0; i < 500 && cleaned < (8u << 20); ++i) {
    cleaned = metric_value(*c, "tierd_cleaned_bytes_total");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Down to 16 MiB of live dirty bytes: two of the six, the farthest reads first (a5, a4).
  CHECK(cleaned == (8u << 20));
  CHECK(tiers_of(*c, "p", "a5") == (kTierRam | kTierNvme));
  CHECK(tiers_of(*c, "p", "a4") == (kTierRam | kTierNvme));
  CHECK(tiers_of(*c, "p", "a3") == kTierRam);
  CHECK(tiers_of(*c, "p", "a7") == kTierRam);  // overwritten next: never written ahead
  CHECK(tiers_of(*c, "q", "b0") == kTierRam);  // no plan: left to eviction
  for (int i = 0; i < 8; ++i) CHECK(read_hash(*c, planned[i]) == hashes[i]);
  // A write makes a cleaned tensor dirty again; evicting it writes it back, and the new bytes
  // are the ones that come back.
  const uint64_t h = write_tensor(*c, planned[5], 999);
  REQUIRE(c->evict("p", {&planned[5], 1}).is_ok());
  CHECK(tiers_of(*c, "p", "a5") == kTierNvme);
  CHECK(read_hash(*c, planned[5]) == h);
}

TEST_CASE("background write-back also keeps a pool's dirty bytes under its share of the pool's quota") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "256M"));  // default ram_dirty_background 0.25: 64 MiB of the node
  auto c = connect_to(d);
  REQUIRE(c->create_pool("small", PoolOptions{.ram_quota = 16u << 20}));  // 0.25 of it: 4 MiB
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    auto t = c->create_tensor("small", desc("t" + std::to_string(i), 4u << 20));
    REQUIRE(t);
    ids.push_back(t->id);
    write_tensor(*c, t->id, 300 + i);
  }
  REQUIRE(c->set_plan("small", ids).is_ok());
  uint64_t cleaned = 0;
  for (int i = 0; i < 500 && cleaned < (8u << 20); ++i) {
    cleaned = metric_value(*c, "tierd_cleaned_bytes_total");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(cleaned == (8u << 20));  // t2 and t1 (read last); 4 MiB stay dirty
  CHECK(tiers_of(*c, "small", "t2") == (kTierRam | kTierNvme));
  CHECK(tiers_of(*c, "small", "t1") == (kTierRam | kTierNvme));
  CHECK(tiers_of(*c, "small", "t0") == kTierRam);
}

TEST_CASE("prefaulted arenas are io_uring fixed buffers; content survives churn and pool re-creation") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "24M", "prefault = true\n"));
  auto c = connect_to(d);
  std::mt19937_64 rng(7);
  // Twice: the second pool's arena is mapped after the first was unmapped (likely at the same
  // address), so I/O must go through the new registration, never the old pinned pages.
  for (int round = 0; round < 2; ++round) {
    const std::string pool = "fixed" + std::to_string(round);
    REQUIRE(c->create_pool(pool, {.ram_quota = 16u << 20}));
    std::vector<uint64_t> ids, hashes;
    for (int i = 0; i < 24; ++i) {  // ~36 MiB in a 16 MiB quota
      auto t = c->create_tensor(pool, desc("t" + std::to_string(i), (1u << 20) + 4096 * (rng() % 256)));
      REQUIRE(t);
      ids.push_back(t->id);
      hashes.push_back(write_tensor(*c, t->id, rng()));
    }
    for (int op = 0; op < 120; ++op) {
      size_t k = rng() % ids.size();
      if (rng() % 3 == 0) hashes[k] = write_tensor(*c, ids[k], rng());
      else REQUIRE(read_hash(*c, ids[k]) == hashes[k]);
      if (op % 40 == 39) REQUIRE(c->evict(pool).is_ok());
    }
    for (size_t k = 0; k < ids.size(); ++k) REQUIRE(read_hash(*c, ids[k]) == hashes[k]);
    // Registration needs CAP_IPC_LOCK or an RLIMIT_MEMLOCK above the arena; where the machine
    // refuses it tierd says so and runs unregistered (the bytes above were still checked).
    if (status_of(*c).nvme.at(0).backend != "io_uring")
      WARN("no io_uring + O_DIRECT on " << nvme.path << ": nothing to register, checked the fallback");
    else if (d.log().find("as fixed buffers failed") != std::string::npos)
      WARN("io_uring refused to register the arenas here (memlock limit): checked unregistered");
    else CHECK(metric_value(*c, "tierd_nvme_registered_buffers{path=\"" + nvme.path + "\"}") == 1);
    REQUIRE(c->drop_pool(pool).is_ok());
  }
}

TEST_CASE("a flipped byte on NVMe is kCorruption to the client and the daemon keeps serving") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto a = c->create_tensor("p", desc("a", 256 << 10));
  auto b = c->create_tensor("p", desc("b", 256 << 10));
  REQUIRE(a);
  REQUIRE(b);
  write_tensor(*c, a->id, 1);
  uint64_t hb = write_tensor(*c, b->id, 2);
  uint64_t ida = a->id;
  REQUIRE(c->evict("p", {&ida, 1}).is_ok());  // the only copy on NVMe: at offset 0 of file 0
  flip_byte(nvme.path + "/data-000000.tier", 1000);

  auto l = c->lease(ida, LeaseMode::kRead, {LeaseWait::kForever});
  REQUIRE_FALSE(l);
  CHECK(l.error().code() == Code::kCorruption);
  CHECK_THAT(l.error().message(), Catch::Contains("checksum"));
  // Again: still corrupt, still an error, never data.
  auto l2 = c->lease(ida, LeaseMode::kRead, {LeaseWait::kForever});
  REQUIRE_FALSE(l2);
  CHECK(l2.error().code() == Code::kCorruption);
  // The daemon serves on: the other tensor, status, new tensors.
  CHECK(read_hash(*c, b->id) == hb);
  CHECK(status_of(*c).ram[0].used > 0);
  auto n = c->create_tensor("p", desc("n", 4096));
  CHECK(n);
}

TEST_CASE("an NVMe quota that is full gives a clear error and loses nothing") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "8M"));
  auto c = connect_to(d);
  PoolOptions po;
  po.nvme_quota = 2u << 20;  // room for two of the 1 MiB tensors on NVMe
  REQUIRE(c->create_pool("q", po));
  std::vector<uint64_t> ids, hashes;
  Status last = fill_until_refused(*c, "q", 16, 1u << 20, 100, ids, hashes);
  // 8 MiB of RAM and 2 MiB of NVMe hold 10 tensors at most.
  REQUIRE_FALSE(last.is_ok());
  CHECK(last.code() == Code::kResourceExhausted);
  CHECK_THAT(last.message(), Catch::Contains("NVMe quota"));
  CHECK(ids.size() >= 8);
  CHECK(ids.size() <= 10);
  // Nothing stored is lost: free room, then read every tensor back.
  REQUIRE(c->delete_tensor("q", "t" + std::to_string(ids.size() - 1)).is_ok());
  ids.pop_back();
  hashes.pop_back();
  REQUIRE(c->delete_tensor("q", "t" + std::to_string(ids.size() - 1)).is_ok());
  ids.pop_back();
  hashes.pop_back();
  for (size_t k = 0; k < ids.size(); ++k) {
    INFO("tensor " << k);
    CHECK(read_hash(*c, ids[k]) == hashes[k]);
  }
  auto pools = c->list_pools();
  REQUIRE(pools);
  REQUIRE(pools->size() == 1);
  CHECK((*pools)[0].nvme_used <= po.nvme_quota);
}

TEST_CASE("a full NVMe tier (nvme_capacity) gives a clear error and loses nothing") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "4M", "nvme_capacity = \"1M\"\n"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("f"));
  std::vector<uint64_t> ids, hashes;
  Status last = fill_until_refused(*c, "f", 12, 512u << 10, 200, ids, hashes);
  REQUIRE_FALSE(last.is_ok());
  CHECK(last.code() == Code::kResourceExhausted);
  CHECK_THAT(last.message(), Catch::Contains("write-back"));
  REQUIRE(c->delete_tensor("f", "t" + std::to_string(ids.size() - 1)).is_ok());
  ids.pop_back();
  hashes.pop_back();
  for (size_t k = 0; k < ids.size(); ++k) {
    INFO("tensor " << k);
    CHECK(read_hash(*c, ids[k]) == hashes[k]);
  }
}

// nvme_flush_behind reaches the engine: evicting a 64 MiB tensor (64 writes of 1 MiB, at most 32
// in flight) with a 1 MiB interval makes tierd flush while the write-back streams; "0" never
// does. Either way the copy comes back bit-exact and every spill still waits for its own sync.
TEST_CASE("nvme_flush_behind: write-behind fdatasyncs during a long write-back, none when 0") {
  for (const char* interval : {"1M", "0"}) {
    INFO("nvme_flush_behind = " << interval);
    TempDir nvme;
    TestDaemon d(nvme_opts(nvme.path, "256M", std::string("nvme_flush_behind = \"") + interval + "\"\n"));
    auto c = connect_to(d);
    REQUIRE(c->create_pool("p"));
    auto t = c->create_tensor("p", desc("w", 64u << 20));
    REQUIRE(t);
    uint64_t h = write_tensor(*c, t->id, 11);
    uint64_t id = t->id;
    REQUIRE(c->evict("p", {&id, 1}).is_ok());
    CHECK(tiers_of(*c, "p", "w") == kTierNvme);
    const uint64_t behind = metric_value(*c, "tierd_nvme_flush_behind_syncs_total");
    const uint64_t syncs = metric_value(*c, "tierd_nvme_syncs_total");
    if (std::string(interval) == "0") CHECK(behind == 0);
    else CHECK(behind >= 1);
    CHECK(syncs >= behind + 1);
    CHECK(read_hash(*c, id) == h);
  }
}

TEST_CASE("a bad nvme_flush_behind stops tierd at start with the key named") {
  TempDir nvme;
  DaemonOptions o = nvme_opts(nvme.path, "16M", "nvme_flush_behind = \"5%\"\n");
  o.wait_ready = false;
  TestDaemon d(o);
  CHECK_FALSE(d.wait_ready(5000));
  CHECK_FALSE(d.running());
  CHECK_THAT(d.log(), Catch::Contains("nvme_flush_behind"));
}

TEST_CASE("the tmpfs fallback (NVMe dir under /dev/shm) works end to end") {
  TempDir nvme("/dev/shm");
  TestDaemon d(nvme_opts(nvme.path, "8M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("s"));
  std::vector<uint64_t> ids, hashes;
  for (int i = 0; i < 12; ++i) {  // 12 MiB through 8 MiB of RAM
    auto t = c->create_tensor("s", desc("t" + std::to_string(i), (1u << 20) - 100 * i));
    REQUIRE(t);
    ids.push_back(t->id);
    hashes.push_back(write_tensor(*c, t->id, 300 + i));
  }
  for (size_t k = 0; k < ids.size(); ++k) CHECK(read_hash(*c, ids[k]) == hashes[k]);
  NodeStatus s = status_of(*c);
  REQUIRE(s.nvme.size() == 1);
  CHECK(s.nvme[0].backend == "pread");
  CHECK(s.misses > 0);
  CHECK_THAT(d.log(), Catch::Contains("tmpfs"));
}

TEST_CASE("SIGTERM stops a daemon with an NVMe tier cleanly and removes its arenas") {
  // The NVMe engine runs threads of its own; a stop signal delivered to one of them, were it
  // not blocked there, would kill the daemon with no drain and no clean exit.
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "16M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto t = c->create_tensor("p", desc("t", 1u << 20));
  REQUIRE(t);
  const uint64_t id = t->id;
  write_tensor(*c, id, 1);
  REQUIRE(c->evict("p", {&id, 1}).is_ok());  // the engine has done I/O
  c.reset();
  const int status = d.stop();
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string log = d.log();
  CHECK(log.find("stopped cleanly") != std::string::npos);
  const size_t at = log.find("arena /tierd-");
  REQUIRE(at != std::string::npos);
  const std::string arena = log.substr(at + 6, log.find(':', at) - at - 6);  // "/tierd-..."
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + arena));                  // --remove-arenas-on-exit ran
}

TEST_CASE("without NVMe directories, Prefetch/Evict/PlanSet stay unsupported") {
  DaemonOptions o;
  o.ram = "16M";
  o.extra_args = {"--remove-arenas-on-exit"};
  TestDaemon d(o);
  auto c = connect_to(d);
  REQUIRE(c->create_pool("u"));
  auto t = c->create_tensor("u", desc("t", 4096));
  REQUIRE(t);
  uint64_t id = t->id;
  CHECK(c->evict("u", {&id, 1}).code() == Code::kUnsupported);
  CHECK(c->prefetch("u", {&id, 1}).code() == Code::kUnsupported);
  CHECK(c->set_plan("u", {&id, 1}).code() == Code::kUnsupported);
  CHECK(c->discard("u", {&id, 1}).is_ok());  // a hint with nothing to save: RAM is the only copy
  CHECK(status_of(*c).nvme.empty());
}

namespace {

// Misses of `steps` cyclic passes over `ids` (after one warm-up pass), `gap` between uses.
uint64_t cyclic_misses(Client& c, const std::vector<uint64_t>& ids, int steps,
                       std::chrono::milliseconds gap) {
  for (uint64_t id : ids) {
    auto l = c.lease(id, LeaseMode::kRead, {LeaseWait::kForever});
    REQUIRE(l);
    std::this_thread::sleep_for(gap);
    REQUIRE(l->release().is_ok());
  }
  uint64_t before = status_of(c).misses;
  for (int s = 0; s < steps; ++s)
    for (uint64_t id : ids) {
      auto l = c.lease(id, LeaseMode::kRead, {LeaseWait::kForever});
      REQUIRE(l);
      std::this_thread::sleep_for(gap);
      REQUIRE(l->release().is_ok());
    }
  return status_of(c).misses - before;
}

}  // namespace

TEST_CASE(
    "a plan whose budget exceeds RAM prefetches up to the high watermark, without a fetch-evict cycle") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));  // high watermark 0.9: 57.6 MiB
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  std::vector<uint64_t> ids, hashes;
  for (int i = 0; i < 24; ++i) {  // 96 MiB
    auto t = c->create_tensor("p", desc("t" + std::to_string(i), 4u << 20));
    REQUIRE(t);
    ids.push_back(t->id);
    hashes.push_back(write_tensor(*c, t->id, 50 + i));
  }
  REQUIRE(c->evict("p").is_ok());
  // The whole plan is the window: every tensor is due now. Above the high watermark the
  // daemon evicts the farthest used ones again, so prefetching past it would fetch them again
  // at once, forever.
  REQUIRE(c->set_plan("p", ids, 1ull << 30).is_ok());
  uint64_t fetched = 0;
  for (int i = 0; i < 100; ++i) {  // settles: nothing more to bring in
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const uint64_t f = metric_value(*c, "tierd_fetches_total");
    if (f > 0 && f == fetched) break;
    fetched = f;
  }
  CHECK(fetched > 0);
  CHECK(fetched <= 14);  // at most 57.6 MiB of 4 MiB tensors
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(metric_value(*c, "tierd_fetches_total") == fetched);  // idle: no cycle
  // The leases the plan announced are granted, with the bytes written before.
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < ids.size(); ++i) CHECK(read_hash(*c, ids[i]) == hashes[i]);
}

TEST_CASE("a registered plan reduces misses on a cyclic access pattern") {
  const int kTensors = 24;  // 24 MiB working set, 12 MiB RAM tier
  const int kSteps = 3;
  uint64_t misses[2] = {0, 0};
  for (int with_plan = 0; with_plan < 2; ++with_plan) {
    TempDir nvme;
    TestDaemon d(nvme_opts(nvme.path, "12M"));
    auto c = connect_to(d);
    REQUIRE(c->create_pool("plan"));
    std::vector<uint64_t> ids;
    for (int i = 0; i < kTensors; ++i) {
      auto t = c->create_tensor("plan", desc("t" + std::to_string(i), 1u << 20));
      REQUIRE(t);
      ids.push_back(t->id);
      write_tensor(*c, t->id, 400 + i);
    }
    if (with_plan) REQUIRE(c->set_plan("plan", ids, 8u << 20).is_ok());
    misses[with_plan] = cyclic_misses(*c, ids, kSteps, std::chrono::milliseconds(4));
    NodeStatus s = status_of(*c);
    WARN("cyclic plan test, " << (with_plan ? "with" : "without") << " a plan: " << misses[with_plan]
                              << " misses in " << kSteps * kTensors << " uses, " << s.prefetches
                              << " prefetches, " << s.stalls << " stalls");
  }
  // Without a plan, LRU misses on (nearly) every use of a cyclic pattern larger than RAM.
  CHECK(misses[0] >= static_cast<uint64_t>(kSteps * kTensors * 3 / 4));
  // With it, Belady keeps part of the set (alone worth about 40% fewer misses here) and
  // prefetches bring the rest ahead of use (typically 0-3 misses). The bound only needs the
  // Belady part, so a slow machine that delays prefetches does not fail it.
  CHECK(misses[1] * 4 < misses[0] * 3);
}

// A lease whose tensors are all in RAM is granted right after the plan's cursor advances, and
// advancing it starts prefetches that evict clean tensors used farthest ahead: the tensor just
// leased (its next use is a whole cycle away) is exactly such a victim. Every lease must still
// see its tensor's last committed bytes, never an extent freed to (and refilled for) another.
TEST_CASE("leases under a plan's prefetches always see the last committed bytes") {
  const int kTensors = 24;  // 24 MiB working set, 12 MiB RAM tier
  const int kCycles = 6;
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "12M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("plan"));
  std::vector<uint64_t> ids;
  std::vector<uint64_t> want;
  for (int i = 0; i < kTensors; ++i) {
    auto t = c->create_tensor("plan", desc("t" + std::to_string(i), (1u << 20) - 64 * i));
    REQUIRE(t);
    ids.push_back(t->id);
    want.push_back(write_tensor(*c, t->id, 700 + i));
  }
  REQUIRE(c->set_plan("plan", ids, 8u << 20).is_ok());
  int mismatches = 0;
  uint64_t seed = 10000;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    for (int i = 0; i < kTensors; ++i) {
      if ((i + cycle) % 3 == 0) {
        auto l = c->lease(ids[i], LeaseMode::kWrite, {LeaseWait::kForever});
        REQUIRE(l);
        if (fnv(l->bytes()) != want[i]) ++mismatches;
        fill(l->bytes(), ++seed);
        want[i] = fnv(l->bytes());
        REQUIRE(l->release().is_ok());
      } else {
        auto l = c->lease(ids[i], LeaseMode::kRead, {LeaseWait::kForever});
        REQUIRE(l);
        if (fnv(l->bytes()) != want[i]) ++mismatches;
        REQUIRE(l->release().is_ok());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  NodeStatus s = status_of(*c);
  INFO(s.prefetches << " prefetches, " << s.misses << " misses");
  CHECK(mismatches == 0);
  for (int i = 0; i < kTensors; ++i) CHECK(read_hash(*c, ids[i]) == want[i]);
}

namespace {

// The whole pages inside `b` (a partial first or last page may be shared with a neighbour).
std::span<std::byte> inner_pages(std::span<std::byte> b) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(b.data());
  const auto lo = (at + page - 1) / page * page;
  const auto hi = (at + b.size()) / page * page;
  REQUIRE(hi > lo);
  return b.subspan(lo - at, hi - lo);
}

// How many of the pages of `b` (page-aligned) are in the arena's page cache (mincore).
size_t resident_pages(std::span<std::byte> b) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v(b.size() / page);
  REQUIRE(::mincore(b.data(), b.size(), v.data()) == 0);
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](unsigned char x) { return x & 1; }));
}

// The bytes of a lease on `id`, as this client maps them (the mapping outlives the lease).
std::span<std::byte> mapped_bytes(Client& c, uint64_t id) {
  auto l = c.lease(id, LeaseMode::kRead, {LeaseWait::kForever});
  REQUIRE(l);
  std::span<std::byte> b = l->bytes();
  REQUIRE(l->release().is_ok());
  return b;
}

}  // namespace

TEST_CASE("arena ranges pinned for DMA keep their pages on eviction; unpinned ranges are punched") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  const uint64_t n = 1u << 20;
  auto a = c->create_tensor("p", desc("a", n));
  auto b = c->create_tensor("p", desc("b", n));
  REQUIRE(a);
  REQUIRE(b);
  const uint64_t ha = write_tensor(*c, a->id, 11);
  write_tensor(*c, b->id, 12);
  std::span<std::byte> ra = mapped_bytes(*c, a->id), rb = mapped_bytes(*c, b->id);
  const size_t pages_a = inner_pages(ra).size() / static_cast<size_t>(::sysconf(_SC_PAGESIZE));

  // What a GPU stager does before cudaHostRegister: a's range is pinned, b's is not.
  REQUIRE(c->pin_for_dma(ra, true).is_ok());
  uint64_t ids[] = {a->id, b->id};
  REQUIRE(c->evict("p", ids).is_ok());
  REQUIRE(tiers_of(*c, "p", "a") == kTierNvme);
  REQUIRE(tiers_of(*c, "p", "b") == kTierNvme);
  // a's pages are still the arena's: resident, its bytes in place (a punched page would now
  // be a hole, and a device registered on the old page would DMA bytes the arena lost).
  CHECK(resident_pages(inner_pages(ra)) == pages_a);
  CHECK(fnv(ra) == ha);
  // b's were punched out.
  CHECK(resident_pages(inner_pages(rb)) == 0);
  CHECK(std::ranges::all_of(inner_pages(rb), [](std::byte x) { return x == std::byte{0}; }));
  CHECK(read_hash(*c, a->id) == ha);  // refetched bit-exact

  // Unpinned: punched again on the next eviction. A second unpin names no pin.
  REQUIRE(c->pin_for_dma(ra, false).is_ok());
  CHECK(c->pin_for_dma(ra, false).code() == Code::kNotFound);
  std::span<std::byte> ra2 = mapped_bytes(*c, a->id);
  REQUIRE(c->evict("p", {&a->id, 1}).is_ok());
  CHECK(resident_pages(inner_pages(ra2)) == 0);

  // A pin goes with its connection: another client pins a's range and disconnects.
  std::span<std::byte> ra3 = mapped_bytes(*c, a->id);
  {
    auto c2 = connect_to(d);
    std::span<std::byte> r2 = mapped_bytes(*c2, a->id);
    REQUIRE(c2->pin_for_dma(r2, true).is_ok());
  }
  // The daemon sees the close asynchronously; a request on c after it is ordered after it only
  // if the close was processed, so wait for the session count to drop.
  for (int i = 0; i < 200 && status_of(*c).clients > 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(c->evict("p", {&a->id, 1}).is_ok());
  CHECK(resident_pages(inner_pages(ra3)) == 0);

  // Memory outside every mapped arena cannot be pinned.
  std::vector<std::byte> mine(4096);
  CHECK(c->pin_for_dma(mine, true).code() == Code::kNotFound);
}

TEST_CASE("a client pins its DMA ranges again after tierd restarts") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto a = c->create_tensor("p", desc("a", 1u << 20));
  REQUIRE(a);
  const uint64_t ha = write_tensor(*c, a->id, 21);
  std::span<std::byte> ra = mapped_bytes(*c, a->id);
  REQUIRE(c->pin_for_dma(ra, true).is_ok());
  d.kill9();  // a crash keeps the arenas (a clean stop here removes them: --remove-arenas-on-exit)
  d.start();
  // The first request reconnects; the restarted tierd has the same arena object and the pin
  // again, so evicting keeps the pages.
  REQUIRE(tiers_of(*c, "p", "a") & kTierRam);
  REQUIRE(c->evict("p", {&a->id, 1}).is_ok());
  REQUIRE(tiers_of(*c, "p", "a") == kTierNvme);
  const size_t pages = inner_pages(ra).size() / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  CHECK(resident_pages(inner_pages(ra)) == pages);
  CHECK(fnv(ra) == ha);
  REQUIRE(c->pin_for_dma(ra, false).is_ok());
}
