// Tenant limits (docs/daemon.md, "Tenant limits"): what one unprivileged uid (65534) can take
// from everyone else through pins, unread replies, pool counts and the answers tierd gives.
// Cases about space run in a private mount + IPC namespace with a small /dev/shm of their own,
// so the node's /dev/shm is never touched. Needs root (as CI runs).
//
// - ArenaPin: pinned pages count as their pool's RAM (tier and quota) until punched, are
//   punched when the pin goes (also when the pinner disconnects), and cannot fill /dev/shm;
// - a client that pipelines requests and never reads its replies holds a bounded number of
//   bytes in tierd (per connection and per uid), which tierd gives back when it goes;
// - at most max_pools_per_uid pools per uid, and no pool NVMe quota beyond the NVMe tier;
// - no answer tells a tenant about another's: LeaseReclaim of a guessed lease, snapshot ids
//   (numbered per pool), the metrics HTTP endpoint (per-pool series opt-in).
//
// Cases tagged [soak] print one "soak-report:" line each (what tierd held at the end against
// its limits); tools/soak runs them as attack rounds.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"
#include "support/tenant.hpp"
#include "../tools/run_binary.hpp"

using namespace tier;
using namespace tier::wire;
using tier::test::as_nobody;
using tier::test::DaemonOptions;
using tier::test::fresh_shm;
using tier::test::must_connect;
using tier::test::RawClient;
using tier::test::TestDaemon;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

uint64_t shm_used() {
  struct statvfs v{};
  REQUIRE(::statvfs("/dev/shm", &v) == 0);
  return (static_cast<uint64_t>(v.f_blocks) - v.f_bfree) * v.f_frsize;
}

// A directory under /tmp that uid 65534 may enter, removed with its contents at the end.
struct TmpDir {
  std::string path;
  explicit TmpDir(const char* what) : path("/tmp/tierd-" + std::string(what) + ".XXXXXX") {
    REQUIRE(::mkdtemp(path.data()) != nullptr);
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Maps arena `arena` through MapArena; nullptr on failure. *size gets its size.
std::byte* map_arena(RawClient& c, uint64_t arena, uint64_t* size) {
  int fd = -1;
  auto m = c.call<MapArenaRep>(MsgType::kMapArena, MapArenaReq{arena}, &fd);
  if (!m || fd < 0) return nullptr;
  void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  *size = m->size;
  return static_cast<std::byte*>(p);
}

// Write-leases tensor `id` and fills it with `pattern` through its arena; 0 when done.
int fill(RawClient& c, uint64_t id, unsigned char pattern, uint64_t* arena = nullptr) {
  auto l = c.lease(LeaseMode::kWrite, {id}, 10000);
  if (!l || l->grants.size() != 1) return 1;
  const LeaseGrant& g = l->grants[0];
  uint64_t size = 0;
  std::byte* base = map_arena(c, g.arena_id, &size);
  if (!base) return 2;
  std::memset(base + g.offset, pattern, g.length);
  ::munmap(base, size);
  if (arena) *arena = g.arena_id;
  return c.release({g.lease_id}) ? 0 : 3;
}

int check(RawClient& c, uint64_t id, unsigned char pattern) {
  auto l = c.lease(LeaseMode::kRead, {id}, 10000);
  if (!l || l->grants.size() != 1) return 1;
  const LeaseGrant& g = l->grants[0];
  uint64_t size = 0;
  std::byte* base = map_arena(c, g.arena_id, &size);
  if (!base) return 2;
  int rc = 0;
  for (uint64_t i = 0; i < g.length && rc == 0; ++i)
    if (static_cast<unsigned char>(base[g.offset + i]) != pattern) rc = 4;
  ::munmap(base, size);
  return c.release({g.lease_id}) ? rc : 3;
}

// The RAM tier's used bytes as tierd reports them (node 0).
uint64_t tier_used(RawClient& c) {
  auto s = c.call<StatusRep>(MsgType::kStatus, Empty{});
  REQUIRE(s);
  REQUIRE_FALSE(s->ram.empty());
  return s->ram[0].used;
}

// A /proc/<pid>/status field in bytes ("RssAnon").
uint64_t proc_kb(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}

bool status_ok(const TestDaemon& d) {
  auto c = RawClient::connect(d.socket());
  return c && c->call<StatusRep>(MsgType::kStatus, Empty{}).has_value();
}

}  // namespace

TEST_CASE("a tenant's pinned arenas count as its RAM until punched and cannot fill /dev/shm", "[soak]") {
  // RAM tier 64 MiB in a 72 MiB /dev/shm; the tenant's pools could promise 3 x 48 MiB.
  fresh_shm("72m");
  TmpDir nvme("pins-nvme");
  DaemonOptions o;
  o.ram = "64M";
  o.extra_args = {"--nvme-dir", nvme.path};
  // The accounting, not the caps (uid_pinned_quota, uid_ram_quota).
  o.config = "uid_pinned_quota = \"100%\"\nuid_ram_quota = \"100%\"\nremove_arenas_on_exit = true\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  const uint64_t shm_before = shm_used();

  // One process pins pool 0's whole arena, evicts it and stays connected; the attack goes on
  // in a second pool while the pin holds.
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  int go[2];
  REQUIRE(::pipe(go) == 0);
  std::fflush(nullptr);
  pid_t pinner = ::fork();
  REQUIRE(pinner >= 0);
  if (pinner == 0) {
    ::close(pipefd[0]);
    ::close(go[1]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(100);
    auto c = RawClient::connect(d.socket());
    if (!c || !c->pool_create("hog0", 48 * kMiB)) _exit(10);
    std::vector<uint64_t> ids;
    uint64_t arena = 0;
    for (int i = 0; i < 12; ++i) {
      auto t = c->tensor_create("hog0", "t" + std::to_string(i), 4 * kMiB);
      if (!t || fill(*c, t->id, 0x40 + i, &arena) != 0) _exit(11);
      ids.push_back(t->id);
    }
    uint64_t size = 0;
    std::byte* base = map_arena(*c, arena, &size);
    if (!base) _exit(12);
    if (!c->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, size, true})) _exit(13);
    if (!c->call<Empty>(MsgType::kEvict, TensorIdsReq{"hog0", ids})) _exit(14);
    char ok = 1;
    if (::write(pipefd[1], &ok, 1) != 1) _exit(15);
    if (::read(go[0], &ok, 1) < 0) _exit(16);  // held until the test says (or it dies: EOF)
    _exit(0);
  }
  ::close(pipefd[1]);
  ::close(go[0]);
  char ok = 0;
  REQUIRE(::read(pipefd[0], &ok, 1) == 1);

  RawClient root = must_connect(d);
  // Evicted but pinned: still resident, so still used (before: 0 of 64 MiB used).
  CHECK(tier_used(root) >= 48 * kMiB);

  // The second pool: its tensors fit what is left (evicting one another); a pin of its whole
  // arena would not fit the tier and is refused. Before: all filled, then SIGBUS.
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c || !c->pool_create("hog1", 48 * kMiB)) return 20;
    uint64_t arena = 0;
    std::vector<uint64_t> ids;
    for (int i = 0; i < 12; ++i) {
      auto t = c->tensor_create("hog1", "t" + std::to_string(i), 4 * kMiB);
      if (!t) return 21;
      ids.push_back(t->id);
      if (fill(*c, t->id, 0x60 + i, &arena) != 0) return 22;
    }
    uint64_t size = 0;
    std::byte* base = map_arena(*c, arena, &size);
    if (!base) return 23;
    auto pin = c->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, size, true});
    if (pin) return 24;
    if (pin.error().code() != Code::kResourceExhausted) return 25;
    (void)c->call<Empty>(MsgType::kEvict, TensorIdsReq{"hog1", ids});
    return 0;
  });
  CHECK(rc == 0);
  CHECK(::kill(d.pid(), 0) == 0);
  // What tierd holds in /dev/shm stays within the tier.
  CHECK(shm_used() <= shm_before + 65 * kMiB);

  // The victim (root) is served: a tensor written and read back.
  REQUIRE(root.pool_create("victim", 16 * kMiB));
  auto vt = root.tensor_create("victim", "v", 8 * kMiB);
  REQUIRE(vt);
  CHECK(fill(root, vt->id, 0x5a) == 0);
  CHECK(check(root, vt->id, 0x5a) == 0);

  // The pinner disconnects: its pin goes, the pages are punched and stop counting.
  const uint64_t pinned_shm = shm_used();
  REQUIRE(::write(go[1], &ok, 1) == 1);
  int st = 0;
  REQUIRE(::waitpid(pinner, &st, 0) == pinner);
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  uint64_t used = 0;
  for (int i = 0; i < 100; ++i) {  // the hang-up is handled on the daemon's next loop turn
    used = tier_used(root);
    if (used < 48 * kMiB) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(used < 48 * kMiB);
  CHECK(shm_used() + 40 * kMiB <= pinned_shm);
  CHECK(check(root, vt->id, 0x5a) == 0);
  CHECK(status_ok(d));
  std::cout << "soak-report: pins: tierd alive, /dev/shm used " << (shm_used() - shm_before) / kMiB
            << " MiB of a 64 MiB RAM tier (72 MiB tmpfs), RAM tier used " << used / kMiB << " MiB, RSS "
            << proc_kb(d.pid(), "VmRSS") / kMiB << " MiB\n";
  d.stop();
}

TEST_CASE("ArenaPin: a uid's pinned bytes are capped (uid_pinned_quota)") {
  DaemonOptions o;
  o.ram = "64M";
  o.config = "uid_pinned_quota = \"8M\"\nremove_arenas_on_exit = true\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c || !c->pool_create("p", 32 * kMiB)) return 10;
    auto t = c->tensor_create("p", "t", 4 * kMiB);
    uint64_t arena = 0;
    if (!t || fill(*c, t->id, 1, &arena) != 0) return 11;
    if (!c->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4 * kMiB, true})) return 12;
    if (!c->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4 * kMiB, true})) return 13;
    auto third = c->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4096, true});
    if (third || third.error().code() != Code::kResourceExhausted) return 14;
    if (third.error().message().find("uid_pinned_quota") == std::string::npos) return 15;
    // Another connection of the same uid shares the cap.
    auto c2 = RawClient::connect(d.socket());
    auto other = c2->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4096, true});
    if (other || other.error().code() != Code::kResourceExhausted) return 16;
    if (!c->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4 * kMiB, false})) return 17;
    if (!c2->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4096, true})) return 18;
    return 0;
  });
  CHECK(rc == 0);
  d.stop();
}

namespace {

// Opens `conns` connections as the caller and on each sends up to `per_conn` PoolList requests
// without reading a reply (non-blocking; gives up on a connection when its socket stays full).
std::vector<int> pipeline_pool_lists(const TestDaemon& d, int conns, int per_conn) {
  std::vector<int> fds;
  std::vector<std::byte> req;
  if (!wire::encode(static_cast<uint16_t>(MsgType::kPoolList), 1, Empty{}, req).is_ok()) return fds;
  for (int i = 0; i < conns; ++i) {
    auto c = RawClient::connect(d.socket());
    if (!c) break;
    int fd = ::dup(c->fd());
    fds.push_back(fd);
    int full_for = 0;
    for (int n = 0; n < per_conn && full_for < 30;) {
      if (::send(fd, req.data(), req.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
        ++n;
        full_for = 0;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        ++full_for;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } else {
        break;
      }
    }
  }
  return fds;
}

// tierd's anonymous memory once it stops growing (its loop has handled what it read).
uint64_t settled_rss(pid_t pid) {
  uint64_t last = 0, now = proc_kb(pid, "RssAnon");
  for (int i = 0; i < 50 && now != last; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    last = now;
    now = proc_kb(pid, "RssAnon");
  }
  return now;
}

}  // namespace

TEST_CASE("replies a client does not read are bounded in bytes per connection and per uid", "[soak]") {
  DaemonOptions o;
  o.ram = "64M";
  o.config =
      "max_reply_bytes_per_connection = \"2M\"\nmax_reply_bytes_per_uid = \"8M\"\nremove_arenas_on_exit = "
      "true\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  constexpr int kConns = 12;
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c) return 10;
    // 60 pools with long names: each PoolList reply is about 18 KiB.
    for (int i = 0; i < 60; ++i) {
      std::string name = std::to_string(i) + "-" + std::string(240, 'p');
      if (!c->pool_create(name, kMiB)) return 11;
    }
    const uint64_t before = settled_rss(d.pid());
    std::vector<int> fds = pipeline_pool_lists(d, kConns, 4096);
    const uint64_t during = settled_rss(d.pid());
    // The victim (root's status, from the parent's view: any connection) is answered meanwhile.
    auto probe = RawClient::connect(d.socket());
    if (!probe || !probe->call<StatusRep>(MsgType::kStatus, Empty{})) return 12;
    for (int fd : fds) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const uint64_t after = settled_rss(d.pid());
    std::cout << "soak-report: slow client: " << fds.size()
              << " connections pipelining PoolList; tierd RssAnon " << before / kMiB << " MiB before, "
              << during / kMiB << " MiB while unread (limits 2 MiB a connection, 8 MiB the uid), "
              << after / kMiB << " MiB after they closed" << std::endl;  // _exit does not flush
    // Before: ~72 MiB a connection (4096 replies), kept after they closed.
    if (during > before + 48 * kMiB) return 13;
    if (after > before + 16 * kMiB) return 14;
    return 0;
  });
  CHECK(rc == 0);
  CHECK(status_ok(d));
  CHECK(d.log().find("stopped reading its replies") != std::string::npos);  // the uid's bound
  d.stop();
}

TEST_CASE("a uid owns at most max_pools_per_uid pools, and a pool's NVMe quota fits the NVMe tier") {
  TmpDir nvme("limits-nvme");
  DaemonOptions o;
  o.ram = "64M";
  o.extra_args = {"--nvme-dir", nvme.path};
  o.config = "nvme_capacity = \"64M\"\nremove_arenas_on_exit = true\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c) return 10;
    // Each with an NVMe quota of its own: 64 pools of the default quota (a quarter of the
    // uid's NVMe share) would not fit uid_nvme_quota.
    for (int i = 0; i < 64; ++i)
      if (!c->call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"p" + std::to_string(i), kMiB, 256 << 10}))
        return 11;
    auto over = c->pool_create("p64", kMiB);
    if (over || over.error().code() != Code::kResourceExhausted) return 12;
    if (over.error().message().find("max_pools_per_uid") == std::string::npos) return 13;
    if (!c->call<Empty>(MsgType::kPoolDrop, PoolNameReq{"p0"})) return 14;
    auto big = c->call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"big", kMiB, uint64_t{1} << 40});
    if (big || big.error().code() != Code::kResourceExhausted) return 15;
    if (!c->call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"fits", kMiB, 32 * kMiB})) return 16;
    return 0;
  });
  CHECK(rc == 0);
  RawClient root = must_connect(d);  // root is not limited
  CHECK(root.pool_create("root-pool", kMiB));
  d.stop();
}

TEST_CASE("a uid holds at most its RAM share however many pools it has; the others are served", "[soak]") {
  // RAM tier 64 MiB, no NVMe tier (nothing is evictable), default uid_ram_quota (75%: 48 MiB).
  fresh_shm("96m");
  DaemonOptions o;
  o.ram = "64M";
  o.config = "remove_arenas_on_exit = true\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  // The tenant creates 4 MiB tensors over 8 pools of 16 MiB until refused; the exit code is
  // how many it got (before: all 16, the whole tier).
  int got = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c) return 100;
    int n = 0;
    for (int p = 0; p < 8; ++p) {
      const std::string pool = "hog" + std::to_string(p);
      if (!c->pool_create(pool, 16 * kMiB)) return 101;
      for (int i = 0; i < 4; ++i) {
        auto t = c->tensor_create(pool, "t" + std::to_string(i), 4 * kMiB);
        if (!t) {
          const bool named = t.error().code() == Code::kResourceExhausted &&
                             t.error().message().find("uid_ram_quota") != std::string::npos;
          return named ? n : 102;
        }
        if (fill(*c, t->id, 0x30) != 0) return 103;
        ++n;
      }
    }
    return n;
  });
  INFO(d.log());
  CHECK(got == 12);  // 48 MiB
  RawClient root = must_connect(d);
  CHECK(tier_used(root) <= 48 * kMiB);
  // Another tenant (root here) still gets the rest of the tier.
  REQUIRE(root.pool_create("victim", 16 * kMiB));
  for (int i = 0; i < 4; ++i) {
    auto t = root.tensor_create("victim", "v" + std::to_string(i), 4 * kMiB);
    INFO(i << ": " << (t ? std::string() : t.error().message()));
    REQUIRE(t);
    CHECK(fill(root, t->id, 0x5a) == 0);
  }
  std::cout << "soak-report: uid RAM share: the tenant holds " << got * 4 << " MiB of a 64 MiB RAM tier "
            << "(uid_ram_quota 48 MiB), /dev/shm used " << shm_used() / kMiB << " MiB, RSS "
            << proc_kb(d.pid(), "VmRSS") / kMiB << " MiB\n";
  d.stop();
}

TEST_CASE("past uid_ram_quota a uid's own tensors go to NVMe; refused only when none can") {
  TmpDir nvme("uidram-nvme");
  DaemonOptions o;
  o.ram = "64M";
  o.extra_args = {"--nvme-dir", nvme.path};
  o.config = "uid_ram_quota = \"16M\"\nnvme_capacity = \"256M\"\nremove_arenas_on_exit = true\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  // Root's tensor, in RAM before the tenant starts: nobody else's RAM makes the tenant's room.
  RawClient root = must_connect(d);
  REQUIRE(root.pool_create("victim", 16 * kMiB));
  auto vt = root.tensor_create("victim", "v", 8 * kMiB);
  REQUIRE(vt);
  REQUIRE(fill(root, vt->id, 0x5a) == 0);
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c || !c->pool_create("a", 32 * kMiB) || !c->pool_create("b", 32 * kMiB)) return 10;
    // 32 MiB over two pools, written: twice the uid's RAM share (before: the create past 16 MiB
    // was refused, though its pools could go to NVMe).
    std::vector<uint64_t> ids;
    for (int i = 0; i < 8; ++i) {
      auto t = c->tensor_create(i < 4 ? "a" : "b", "t" + std::to_string(i), 4 * kMiB);
      if (!t) {
        std::cerr << "create " << i << ": " << t.error().message() << "\n";
        return 11;
      }
      if (fill(*c, t->id, static_cast<unsigned char>(0x40 + i)) != 0) return 12;
      ids.push_back(t->id);
    }
    // Read back: each fetch makes room from the uid's own tensors.
    for (int i = 0; i < 8; ++i)
      if (check(*c, ids[i], static_cast<unsigned char>(0x40 + i)) != 0) return 13;
    // Four leased at once fill the share: a fifth cannot be given RAM, and the error says why.
    auto held = c->lease(LeaseMode::kRead, {ids[0], ids[1], ids[2], ids[3]}, 10000);
    if (!held) return 14;
    auto more = c->lease(LeaseMode::kRead, {ids[4]}, 0);
    if (more) return 15;
    if (more.error().code() != Code::kResourceExhausted ||
        more.error().message().find("uid_ram_quota") == std::string::npos) {
      std::cerr << "fifth: " << more.error().message() << "\n";
      return 16;
    }
    return 0;
  });
  INFO(d.log());
  CHECK(rc == 0);
  // The tenant never held more than its share; root's tensor stayed.
  CHECK(tier_used(root) <= 24 * kMiB);
  CHECK(check(root, vt->id, 0x5a) == 0);
  d.stop();
}

TEST_CASE("a uid's NVMe share is finite by default; a pool without an NVMe quota gets a quarter of it") {
  TmpDir nvme("uidnvme");
  DaemonOptions o;
  o.ram = "64M";
  o.extra_args = {"--nvme-dir", nvme.path};
  o.config = "nvme_capacity = \"64M\"\nremove_arenas_on_exit = true\n";  // uid_nvme_quota 75%: 48 MiB
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c) return 10;
    // Default pools: 12 MiB each (before: each promised the whole 64 MiB tier).
    for (int i = 0; i < 2; ++i) {
      auto p = c->pool_create("job" + std::to_string(i), kMiB);
      if (!p) return 11;
      if (p->nvme_quota != 12 * kMiB) {
        std::cerr << "default pool NVMe quota " << p->nvme_quota << "\n";
        return 12;
      }
    }
    // 24 MiB reserved: 16 MiB more fit, 16 MiB after that do not (48 MiB in all).
    if (!c->call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"big0", kMiB, 16 * kMiB})) return 13;
    auto over = c->call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{"big1", kMiB, 16 * kMiB});
    if (over || over.error().code() != Code::kResourceExhausted) return 14;
    if (over.error().message().find("uid_nvme_quota") == std::string::npos) return 15;
    // What is left (8 MiB) goes to a last default pool; then nothing is left.
    auto last = c->pool_create("job2", kMiB);
    if (!last || last->nvme_quota != 8 * kMiB) return 16;
    if (c->pool_create("job3", kMiB)) return 17;
    return 0;
  });
  INFO(d.log());
  CHECK(rc == 0);
  RawClient root = must_connect(d);  // root is not limited
  CHECK(root.pool_create("root-pool", kMiB));
  d.stop();
}

TEST_CASE("tierd --check-config shows the tenant limits and refuses inconsistent ones") {
  TmpDir dir("limits-cfg");
  const std::string cfg = dir.path + "/t.toml";
  std::ofstream(cfg) << "state_dir = \"" << dir.path << "/state\"\nram = \"64M\"\nmax_pools_per_uid = 7\n";
  auto r = tier::test::run_binary(tier::test::bin_path("tierd"), {"--config", cfg, "--check-config"}, {}, 30);
  INFO(r.out << r.err);
  CHECK(r.rc == 0);
  CHECK(r.out.find("max_pools_per_uid 7") != std::string::npos);
  CHECK(r.out.find("uid_pinned_quota 32.0 MiB") != std::string::npos);  // 50% of the tier
  CHECK(r.out.find("uid_ram_quota 48.0 MiB") != std::string::npos);     // 75% of the tier
  CHECK(r.out.find("uid_nvme_quota 75% of the NVMe tier") != std::string::npos);
  CHECK(r.out.find("max_reply_bytes_per_connection 4.00 MiB") != std::string::npos);
  CHECK(r.out.find("metrics_http_per_pool false") != std::string::npos);
  std::ofstream(cfg) << "state_dir = \"" << dir.path << "/state\"\nram = \"64M\"\n"
                     << "max_reply_bytes_per_connection = \"8M\"\nmax_reply_bytes_per_uid = \"4M\"\n";
  auto bad =
      tier::test::run_binary(tier::test::bin_path("tierd"), {"--config", cfg, "--check-config"}, {}, 30);
  CHECK(bad.rc != 0);
  CHECK(bad.err.find("max_reply_bytes_per_uid") != std::string::npos);
}

TEST_CASE("LeaseReclaim of another uid's lease is refused as if it did not exist") {
  DaemonOptions o;
  o.ram = "64M";
  o.config = "remove_arenas_on_exit = true\n";  // not on kill -9: root's arena survives it
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  RawClient root = must_connect(d);
  REQUIRE(root.pool_create("rp", 8 * kMiB));
  auto t = root.tensor_create("rp", "w", kMiB);
  REQUIRE(t);
  auto l = root.lease(LeaseMode::kWrite, {t->id}, 5000);
  REQUIRE(l);
  const uint64_t lease = l->grants[0].lease_id;
  // A holder is one that still maps the arena writable (daemon/leases/reclaim.hpp).
  uint64_t mapped = 0;
  std::byte* base = map_arena(root, l->grants[0].arena_id, &mapped);
  REQUIRE(base != nullptr);
  d.kill9();
  d.start();
  REQUIRE(d.wait_ready());
  // Root's write lease is kept for it across the restart; uid 65534 guesses its ids.
  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c) return 10;
    auto a = c->call<LeaseRep>(MsgType::kLeaseReclaim, LeaseReclaimReq{t->id, lease});
    auto b = c->call<LeaseRep>(MsgType::kLeaseReclaim, LeaseReclaimReq{t->id, lease + 7});
    if (a || b) return 11;
    if (a.error().code() != Code::kNotFound || b.error().code() != Code::kNotFound) return 12;
    std::string ma = a.error().message(), mb = b.error().message();
    // The same words either way, the ids aside: nothing about the holder.
    if (ma.find("uid") != std::string::npos || ma.find("pid") != std::string::npos) return 13;
    auto strip = [](std::string s, uint64_t id) {
      std::string n = std::to_string(id);
      if (auto at = s.find(n); at != std::string::npos) s.erase(at, n.size());
      return s;
    };
    if (strip(ma, lease) != strip(mb, lease + 7)) return 14;
    return 0;
  });
  CHECK(rc == 0);
  // Root, the holder, still gets it back.
  auto again = RawClient::connect(d.socket());
  REQUIRE(again);
  auto back = again->call<LeaseRep>(MsgType::kLeaseReclaim, LeaseReclaimReq{t->id, lease});
  INFO((back ? std::string("ok") : back.error().to_string()));
  CHECK(back.has_value());
  ::munmap(base, mapped);
  d.stop();
}

TEST_CASE("snapshot ids are numbered per pool") {
  DaemonOptions o;
  o.ram = "64M";
  o.config = "remove_arenas_on_exit = true\n";
  TestDaemon d(o);
  RawClient c = must_connect(d);
  for (const char* p : {"a", "b"}) {
    REQUIRE(c.pool_create(p, 8 * kMiB));
    auto t = c.tensor_create(p, "t", kMiB);
    REQUIRE(t);
    REQUIRE(fill(c, t->id, p[0]) == 0);
  }
  auto a1 = c.call<SnapshotRep>(MsgType::kSnapshotTake, SnapshotTakeReq{"a", 0, 4});
  auto a2 = c.call<SnapshotRep>(MsgType::kSnapshotTake, SnapshotTakeReq{"a", 0, 4});
  auto b1 = c.call<SnapshotRep>(MsgType::kSnapshotTake, SnapshotTakeReq{"b", 0, 4});
  REQUIRE(a1);
  REQUIRE(a2);
  REQUIRE(b1);
  CHECK(a1->snapshot_id == 1);
  CHECK(a2->snapshot_id == 2);
  CHECK(b1->snapshot_id == 1);  // before: 3, telling b's owner that a was snapshotted twice
  auto rb = c.call<SnapshotRestoreRep>(MsgType::kSnapshotRestore, SnapshotRestoreReq{"b", 1});
  CHECK(rb.has_value());
  // Across a restart the numbering goes on above the pool's snapshots.
  d.stop();
  d.start();
  REQUIRE(d.wait_ready());
  RawClient c2 = must_connect(d);
  auto a3 = c2.call<SnapshotRep>(MsgType::kSnapshotTake, SnapshotTakeReq{"a", 0, 4});
  REQUIRE(a3);
  CHECK(a3->snapshot_id == 3);
  auto list = c2.call<SnapshotListRep>(MsgType::kSnapshotList, PoolNameReq{"a"});
  REQUIRE(list);
  CHECK(list->snapshots.size() == 3);
  d.stop();
}
