// Tagged snapshots, several kept, and rolling a live pool back to one of them
// (docs/daemon.md "Snapshots" and "Restoring a snapshot"): the pool reads as it was at the
// snapshot whatever tier each tensor is on, tensors created since are deleted, newer
// snapshots dropped; a restart and a reboot afterwards keep the restored bytes; a reboot marks
// the pool recovered until it is restored; damaged snapshot files change nothing. Needs root
// (a simulated reboot: private IPC + mount namespace, fresh /dev/shm).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "snapshot_util.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

using namespace tier;
using tier::test::DaemonOptions;
using tier::test::TestDaemon;
using namespace tier::test::snap;
namespace fs = std::filesystem;

namespace {

constexpr size_t kSize = 256 << 10;

// Writes version v of the named tensors; returns their hashes.
std::map<std::string, uint64_t> write_all(Client& c, const std::string& pool,
                                          const std::vector<std::string>& names, int v) {
  std::map<std::string, uint64_t> h;
  for (const auto& n : names) h[n] = write_version(c, c.open_tensor(pool, n)->id, n, v);
  return h;
}

void evict_some(Client& c, const std::string& pool, const std::vector<std::string>& names) {
  std::vector<uint64_t> ids;
  ids.reserve(names.size());
  for (const auto& n : names) ids.push_back(c.open_tensor(pool, n)->id);
  REQUIRE(c.evict(pool, ids).is_ok());
}

void check_reads(Client& c, const std::string& pool, const std::map<std::string, uint64_t>& want) {
  for (const auto& [n, h] : want) {
    INFO(n);
    auto got = read_hash(c, pool, n);
    REQUIRE(got.has_value());
    CHECK(*got == h);
  }
}

// Flips bit 6 of the byte at `offset` of file `path` (twice: as it was).
void flip_bit(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(static_cast<std::streamoff>(offset));
  char ch = 0;
  f.read(&ch, 1);
  f.seekp(static_cast<std::streamoff>(offset));
  ch = static_cast<char>(ch ^ 0x40);
  f.write(&ch, 1);
  REQUIRE(f);
}

size_t snapshot_dirs(const TestDaemon& d, const std::string& pool) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(d.state_dir() + "/snapshots/" + pool)) n += e.is_directory();
  return n;
}

// fresh_boot() before the members of a class derived from it are made.
struct FreshBoot {
  FreshBoot() { fresh_boot(); }
};

// After a fresh boot: a tierd with 64 MiB of RAM and an NVMe tier, and a client `c` that made
// `pool` (8 MiB RAM quota).
struct PoolOnNvme : FreshBoot {
  TempDir nvme{"restore"};
  TestDaemon d{with_nvme(nvme, "64M")};
  std::unique_ptr<Client> c = connect_to(d);

  explicit PoolOnNvme(const std::string& pool) {
    REQUIRE(c->create_pool(pool, {.ram_quota = 8 << 20}).has_value());
  }

  // kill -9 of tierd and a start again, with a reboot in between if `reboot`; `c` is then a
  // new connection.
  void restart(bool reboot) {
    c.reset();
    d.kill9();
    if (reboot) fresh_boot();
    d.start();
    c = connect_to(d);
  }
};

}  // namespace

TEST_CASE(
    "a pool rolls back to a kept, tagged snapshot: every tier, new tensors deleted, across restart and "
    "reboot") {
  PoolOnNvme f("r");
  auto& c = f.c;  // a new connection after each f.restart()
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) {
    names.push_back("t" + std::to_string(i));
    put(*c, "r", names.back(), kSize, 1);
  }
  auto s1 = c->snapshot("r", {.tag = 10, .keep = 2});
  REQUIRE(s1.has_value());

  // Version 2, some of it only on NVMe, and a tensor that exists from here on.
  auto v2 = write_all(*c, "r", names, 2);
  evict_some(*c, "r", {"t0", "t1", "t2", "t3"});
  v2["extra"] = put(*c, "r", "extra", kSize, 2);
  auto s2 = c->snapshot("r", {.tag = 20, .keep = 2});
  REQUIRE(s2.has_value());
  CHECK(s2->bytes == 13 * kSize);

  // Version 3 of half of them, two of those written back (a newer NVMe copy than s2's bytes).
  std::vector<std::string> half(names.begin(), names.begin() + 6);
  write_all(*c, "r", half, 3);
  evict_some(*c, "r", {"t0", "t4"});
  auto s3 = c->snapshot("r", {.tag = 30, .keep = 2});
  REQUIRE(s3.has_value());

  // keep = 2: s1 went when s3 became durable.
  auto l = c->list_snapshots("r");
  REQUIRE(l.has_value());
  CHECK_FALSE(l->recovered);
  REQUIRE(l->snapshots.size() == 2);
  CHECK(l->snapshots[0].snapshot_id == s2->snapshot_id);
  CHECK(l->snapshots[0].tag == 20);
  CHECK(l->snapshots[1].snapshot_id == s3->snapshot_id);
  CHECK(l->snapshots[1].tag == 30);
  CHECK(snapshot_dirs(f.d, "r") == 2);

  // After s3: version 4 of a few, and another new tensor.
  write_all(*c, "r", {"t0", "t7", "t11"}, 4);
  put(*c, "r", "later", kSize, 4);

  SECTION("refused while a lease is held, for an unknown or dropped snapshot") {
    auto lease = c->lease(c->open_tensor("r", "t5")->id, LeaseMode::kRead);
    REQUIRE(lease.has_value());
    auto busy = c->restore_snapshot("r", s2->snapshot_id);
    REQUIRE_FALSE(busy.has_value());
    CHECK(busy.error().code() == Code::kBusy);
    REQUIRE(lease->release().is_ok());
    auto gone = c->restore_snapshot("r", s1->snapshot_id);
    REQUIRE_FALSE(gone.has_value());
    CHECK(gone.error().code() == Code::kNotFound);
    CHECK(gone.error().message().find(std::to_string(s2->snapshot_id)) !=
          std::string::npos);  // names what exists
    // Nothing changed: the pool still reads as after s3 (t0 at version 4).
    CHECK(c->open_tensor("r", "later").has_value());
    std::vector<std::byte> want(kSize);
    const uint64_t v3 = fill(want, "t5", 3);
    CHECK(read_hash(*c, "r", "t5") == std::optional<uint64_t>(v3));
  }

  SECTION("restored to s2, then a restart and a reboot read the same") {
    auto r = c->restore_snapshot("r", s2->snapshot_id);
    REQUIRE(r.has_value());
    CHECK(r->tensors == 13);
    CHECK(r->bytes == 13 * kSize);
    CHECK(r->deleted == 1);            // "later"
    CHECK(r->dropped_snapshots == 1);  // s3
    check_reads(*c, "r", v2);
    CHECK_FALSE(c->open_tensor("r", "later").has_value());
    auto after = c->list_snapshots("r");
    REQUIRE(after.has_value());
    REQUIRE(after->snapshots.size() == 1);
    CHECK(after->snapshots[0].snapshot_id == s2->snapshot_id);

    f.restart(false);  // arenas re-attached, and no stale NVMe copy of version 3 or 4 wins
    check_reads(*c, "r", v2);

    // Written back and dropped partly again, then a reboot: every arena gone.
    evict_some(*c, "r", {"t1", "t5", "t6"});
    f.restart(true);
    check_reads(*c, "r", v2);
    auto rec = c->list_snapshots("r");
    REQUIRE(rec.has_value());
    CHECK(rec->recovered);  // the reboot rebuilt the pool: a mix until restored
    CHECK(rec->recovered_from == s2->snapshot_id);
    CHECK(rec->lost == 0);
    REQUIRE(c->restore_snapshot("r", s2->snapshot_id).has_value());
    auto clean = c->list_snapshots("r");
    REQUIRE(clean.has_value());
    CHECK_FALSE(clean->recovered);
    check_reads(*c, "r", v2);
  }
}

TEST_CASE(
    "a reboot leaves a pool recovered (a mix of points in time) until it is restored, and a damaged snapshot "
    "changes nothing") {
  PoolOnNvme f("m");
  auto& c = f.c;  // a new connection after each f.restart()
  std::vector<std::string> names = {"a", "b", "c", "d"};
  std::map<std::string, uint64_t> v1;
  for (const auto& n : names) v1[n] = put(*c, "m", n, kSize, 1);
  auto s = c->snapshot("m", {.tag = 1, .keep = 1});
  REQUIRE(s.has_value());
  // Version 2 of all four; a and b written back to NVMe. A reboot then brings a, b back at
  // version 2 (their NVMe copies) and c, d at version 1 (the snapshot): one pool, two points.
  auto v2 = write_all(*c, "m", names, 2);
  evict_some(*c, "m", {"a", "b"});
  f.restart(true);
  check_reads(*c, "m", {{"a", v2["a"]}, {"b", v2["b"]}, {"c", v1["c"]}, {"d", v1["d"]}});
  auto l = c->list_snapshots("m");
  REQUIRE(l.has_value());
  CHECK(l->recovered);
  CHECK(l->recovered_from == s->snapshot_id);
  REQUIRE(l->snapshots.size() == 1);
  CHECK(l->snapshots[0].tag == 1);

  // One flipped byte in the snapshot's data: refused before anything changes.
  std::string data = f.d.state_dir() + "/snapshots/m/" + std::to_string(s->snapshot_id) + "/data";
  flip_bit(data, 2 * kSize + 100);  // in tensor c
  auto bad = c->restore_snapshot("m", s->snapshot_id);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == Code::kCorruption);
  check_reads(*c, "m", {{"a", v2["a"]}, {"b", v2["b"]}, {"c", v1["c"]}, {"d", v1["d"]}});
  CHECK(c->list_snapshots("m")->recovered);

  // Repaired: the restore brings every tensor to the snapshot's point.
  flip_bit(data, 2 * kSize + 100);
  auto r = c->restore_snapshot("m", s->snapshot_id);
  REQUIRE(r.has_value());
  CHECK(r->tensors == 4);
  check_reads(*c, "m", v1);
  CHECK_FALSE(c->list_snapshots("m")->recovered);
  // keep must be 1..16.
  auto k0 = c->snapshot("m", {.tag = 2, .keep = 0});
  REQUIRE_FALSE(k0.has_value());
  CHECK(k0.error().code() == Code::kInvalidArgument);
}
