// Tenancy: every request kind, tried by one uid on another uid's pool, answers with the exact
// code docs/daemon.md promises; group readers, admins and per-uid limits. The daemon runs as
// root (this test's uid); each party is a forked child that drops to its own uid/gid/groups
// with setgroups + setgid + setuid and reports the codes it saw through a pipe.
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"
#include "tier/client.hpp"
#include "wire/messages.hpp"

using namespace tier;
using namespace tier::wire;
using tier::test::RawClient;
using tier::test::TestDaemon;

namespace {

struct Who {
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;
};

constexpr gid_t kReaders = 4242;  // the pool's read group
const Who kOwner{65534, 65534, {}};
const Who kStranger{65533, 65533, {}};
const Who kReader{65532, 65532, {kReaders}};
const Who kAdmin{65531, 65531, {4}};  // supplementary "adm" (gid 4), the admin_group below

// Runs `fn` in a child as `w`; returns what it produced (or {-999} when the child failed).
std::vector<int64_t> as(const Who& w, const std::function<std::vector<int64_t>()>& fn) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    if (::setgroups(w.groups.size(), w.groups.data()) != 0 || ::setgid(w.gid) != 0 || ::setuid(w.uid) != 0)
      _exit(3);
    std::vector<int64_t> v = fn();
    (void)!::write(p[1], v.data(), v.size() * sizeof(int64_t));
    _exit(0);
  }
  ::close(p[1]);
  std::vector<int64_t> v;
  int64_t x;
  while (::read(p[0], &x, sizeof x) == sizeof x) v.push_back(x);
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return {-999};
  return v;
}

template <class T> int64_t code(const Result<T>& r) { return r ? 0 : static_cast<int64_t>(r.error().code()); }
int64_t code(const Status& s) { return static_cast<int64_t>(s.code()); }
constexpr int64_t c(Code x) { return static_cast<int64_t>(x); }

// Every request kind on pool `pool` (tensor `tid` named "t", arena `aid`); one code per kind,
// then two flags: the pool shows in PoolList, and its name shows in Metrics.
std::vector<int64_t> try_everything(const std::string& sock, const std::string& pool, uint64_t tid,
                                    uint64_t aid) {
  auto rc = RawClient::connect(sock);
  if (!rc) return {-1};
  RawClient& r = *rc;
  std::vector<int64_t> v;
  v.push_back(code(r.call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{pool, 0, 0, true})));   // 0
  v.push_back(code(r.call<PoolInfoW>(MsgType::kPoolCreate, PoolCreateReq{pool, 0, 0, false})));  // 1
  v.push_back(code(r.call<PoolInfoW>(MsgType::kPoolOpen, PoolNameReq{pool})));                   // 2
  auto list = r.call<PoolListRep>(MsgType::kPoolList, Empty{});                                  // 3
  v.push_back(code(list));
  v.push_back(code(r.call<TensorInfoW>(MsgType::kTensorCreate,
                                       TensorCreateReq{pool, "x", 4096, 0, {}, 0, -1, false})));  // 4
  v.push_back(code(r.call<TensorInfoW>(MsgType::kTensorOpen, TensorRefReq{pool, "t"})));          // 5
  v.push_back(code(r.call<TensorListRep>(MsgType::kTensorList, TensorListReq{pool})));            // 6
  v.push_back(code(r.call<Empty>(MsgType::kTensorDelete, TensorRefReq{pool, "t"})));              // 7
  auto lr = r.lease(LeaseMode::kRead, {tid});                                                     // 8
  v.push_back(code(lr));
  v.push_back(code(r.lease(LeaseMode::kWrite, {tid})));  // 9
  v.push_back(code(r.release({777777})));                // 10
  int fd = -1;
  auto m = r.call<MapArenaRep>(MsgType::kMapArena, MapArenaReq{aid}, &fd);  // 11
  v.push_back(code(m));
  int64_t writable = -1;
  if (fd >= 0) {
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    writable = p != MAP_FAILED;
    if (p != MAP_FAILED) ::munmap(p, 4096);
    ::close(fd);
  }
  v.push_back(code(r.call<Empty>(MsgType::kPrefetch, TensorIdsReq{pool, {tid}})));      // 12
  v.push_back(code(r.call<Empty>(MsgType::kEvict, TensorIdsReq{pool, {tid}})));         // 13
  v.push_back(code(r.call<Empty>(MsgType::kPlanSet, PlanSetReq{pool, {tid}, 0, {}})));  // 14
  v.push_back(code(r.call<SnapshotRep>(MsgType::kSnapshot, PoolNameReq{pool})));        // 15
  // 23..25, asked here, while the pool exists
  const int64_t take = code(r.call<SnapshotRep>(MsgType::kSnapshotTake, SnapshotTakeReq{pool, 7, 2}));
  const int64_t snaps = code(r.call<SnapshotListRep>(MsgType::kSnapshotList, PoolNameReq{pool}));
  const int64_t restore =
      code(r.call<SnapshotRestoreRep>(MsgType::kSnapshotRestore, SnapshotRestoreReq{pool, 1}));
  v.push_back(code(r.call<StatusRep>(MsgType::kStatus, Empty{})));  // 16
  v.push_back(code(r.call<TopoRep>(MsgType::kTopo, Empty{})));      // 17
  auto met = r.call<TextRep>(MsgType::kMetrics, MetricsReq{0});     // 18
  v.push_back(code(met));
  for (uint32_t page = 1; met && met->more && page < 1000; ++page) {  // the per-pool series come later
    auto next = r.call<TextRep>(MsgType::kMetrics, MetricsReq{page});
    if (!next) break;
    met->text += next->text;
    met->more = next->more;
  }
  v.push_back(code(r.call<Empty>(MsgType::kPoolDrop, PoolNameReq{pool})));  // 19
  bool listed = false;
  if (list)
    for (const auto& p : list->pools) listed = listed || p.name == pool;
  v.push_back(listed);                                                               // 20
  v.push_back(met && met->text.find("pool=\"" + pool + "\"") != std::string::npos);  // 21
  v.push_back(writable);                                                             // 22
  v.push_back(take);                                                                 // 23
  v.push_back(snaps);                                                                // 24
  v.push_back(restore);                                                              // 25
  return v;
}

const char* kKinds[] = {"PoolCreate exist_ok",
                        "PoolCreate",
                        "PoolOpen",
                        "PoolList",
                        "TensorCreate",
                        "TensorOpen",
                        "TensorList",
                        "TensorDelete",
                        "Lease read",
                        "Lease write",
                        "Release (foreign id)",
                        "MapArena",
                        "Prefetch",
                        "Evict",
                        "PlanSet",
                        "Snapshot",
                        "Status",
                        "Topo",
                        "Metrics",
                        "PoolDrop",
                        "listed",
                        "in metrics",
                        "fd writable",
                        "SnapshotTake",
                        "SnapshotList",
                        "SnapshotRestore"};

// NVMe-only kinds answer kUnsupported before any authorization when the daemon has no NVMe
// tier; with one, they must be refused like the rest.
void check_nvme_kind(int64_t got, int64_t want, const char* kind) {
  INFO(kind);
  if (got == c(Code::kUnsupported)) {
    WARN(std::string(kind) + ": kUnsupported (no NVMe tier in this daemon); authorization not exercised");
    return;
  }
  CHECK(got == want);
}

std::string write_config(const std::string& dir, const std::string& text) {
  std::string path = dir + "/tenancy.toml";
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("every request kind on another uid's pool: stranger, group reader, admin") {
  char tmpl[] = "/tmp/tier-tenancy.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string cfg = write_config(tmpl, "admin_group = \"adm\"\nremove_arenas_on_exit = true\n");
  // With an NVMe directory, so Prefetch/Evict/PlanSet/Snapshot reach their authorization.
  std::string nvme = std::string(tmpl) + "/nvme";
  std::filesystem::create_directories(nvme);
  auto opts = tier::test::DaemonOptions::with_config(cfg);
  opts.extra_args.insert(opts.extra_args.end(), {"--nvme-dir", nvme});
  TestDaemon d(opts);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);  // mkdtemp made it 0700: other uids must reach the socket
  const std::string sock = d.socket();

  // The owner makes a group-readable pool with tensor "t" (bytes 0..255) and a private pool.
  auto made = as(kOwner, [&]() -> std::vector<int64_t> {
    auto cl = Client::connect(sock);
    if (!cl) return {-1};
    auto p = (*cl)->create_pool(
        "shared", {.ram_quota = 8 << 20, .nvme_quota = 0, .group = kReaders, .group_read = true});
    auto q = (*cl)->create_pool("private", {.ram_quota = 8 << 20});
    if (!p || !q || p->group != kReaders || !p->group_read) return {-2};
    auto t = (*cl)->create_tensor("shared", {.name = "t", .size = 4096, .shape = {}, .placement = {}});
    auto u = (*cl)->create_tensor("private", {.name = "t", .size = 4096, .shape = {}, .placement = {}});
    if (!t || !u) return {-3};
    auto l = (*cl)->lease(t->id, LeaseMode::kWrite);
    if (!l) return {-4};
    for (size_t i = 0; i < l->bytes().size(); ++i) l->bytes()[i] = static_cast<std::byte>(i & 0xff);
    if (!l->release().is_ok()) return {-5};
    auto arenas = (*cl)->mapped_arenas();
    if (arenas.empty()) return {-6};
    return {static_cast<int64_t>(t->id), static_cast<int64_t>(u->id),
            static_cast<int64_t>(arenas[0].arena_id), static_cast<int64_t>(p->id << 16)};
  });
  REQUIRE(made.size() == 4);
  const uint64_t shared_t = made[0], private_t = made[1], shared_arena = made[2];
  const uint64_t private_arena = ((shared_arena >> 16) + 1) << 16;  // pools get consecutive ids, node 0
  const int64_t OK = 0, DENIED = c(Code::kPermissionDenied), EXISTS = c(Code::kAlreadyExists),
                NOTFOUND = c(Code::kNotFound);

  SECTION("a stranger may do nothing with either pool") {
    for (auto [pool, tid, aid] :
         {std::tuple{"shared", shared_t, shared_arena}, {"private", private_t, private_arena}}) {
      auto v = as(kStranger, [&] { return try_everything(sock, pool, tid, aid); });
      REQUIRE(v.size() == 26);
      std::vector<int64_t> want = {DENIED, EXISTS,   DENIED, OK,     DENIED, DENIED, DENIED, DENIED, DENIED,
                                   DENIED, NOTFOUND, DENIED, DENIED, DENIED, DENIED, DENIED, OK,     OK,
                                   OK,     DENIED,   0,      0,      -1,     DENIED, DENIED, DENIED};
      for (size_t i = 0; i < want.size(); ++i) {
        INFO(pool << ": " << kKinds[i]);
        if (i >= 12 && i <= 15) check_nvme_kind(v[i], want[i], kKinds[i]);
        else CHECK(v[i] == want[i]);
      }
    }
  }

  SECTION("a member of the pool's group may read it, but not change it") {
    auto v = as(kReader, [&] { return try_everything(sock, "shared", shared_t, shared_arena); });
    REQUIRE(v.size() == 26);
    std::vector<int64_t> want = {DENIED, EXISTS,   OK, OK,     DENIED, OK,     OK,     DENIED, OK,
                                 DENIED, NOTFOUND, OK, DENIED, DENIED, DENIED, DENIED, OK,     OK,
                                 OK,     DENIED,   1,  1,      0,      DENIED, DENIED, DENIED};
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(kKinds[i]);
      if (i >= 12 && i <= 15) check_nvme_kind(v[i], want[i], kKinds[i]);
      else CHECK(v[i] == want[i]);
    }
    // Through libtier: a read lease maps the arena read-only and sees the owner's bytes.
    auto bytes = as(kReader, [&]() -> std::vector<int64_t> {
      auto cl = Client::connect(sock);
      if (!cl) return {-1};
      auto l = (*cl)->lease(shared_t, LeaseMode::kRead);
      if (!l) return {-static_cast<int64_t>(l.error().code())};
      int64_t ok = 1;
      for (size_t i = 0; i < l->bytes().size(); ++i) ok &= l->bytes()[i] == static_cast<std::byte>(i & 0xff);
      return {ok, code((*cl)->lease(private_t, LeaseMode::kRead))};
    });
    CHECK(bytes == std::vector<int64_t>{1, DENIED});
  }

  SECTION("an admin_group member (supplementary group) may inspect and drop, never lease or map") {
    auto v = as(kAdmin, [&] { return try_everything(sock, "private", private_t, private_arena); });
    REQUIRE(v.size() == 26);
    std::vector<int64_t> want = {DENIED, EXISTS,   OK,     OK,     DENIED, OK,     OK,     DENIED, DENIED,
                                 DENIED, NOTFOUND, DENIED, DENIED, DENIED, DENIED, DENIED, OK,     OK,
                                 OK,     OK,       1,      1,      -1,     DENIED, DENIED, DENIED};
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(kKinds[i]);
      if (i >= 12 && i <= 15) check_nvme_kind(v[i], want[i], kKinds[i]);
      else CHECK(v[i] == want[i]);
    }
  }

  SECTION("root inspects like an admin but cannot lease another uid's tensor") {
    auto cl = Client::connect(sock);
    REQUIRE(cl);
    CHECK((*cl)->open_pool("private").has_value());
    auto l = (*cl)->lease(private_t, LeaseMode::kRead);
    REQUIRE(!l);
    CHECK(l.error().code() == Code::kPermissionDenied);
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

TEST_CASE("per-uid RAM quota, connections per uid and waiting leases per client") {
  char tmpl[] = "/tmp/tier-tenancy.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string cfg = std::string(tmpl) + "/limits.toml";
  std::ofstream(cfg) << "uid_ram_quota = \"64K\"\nmax_connections_per_uid = 3\nmax_waiters_per_client = 1\n"
                        "remove_arenas_on_exit = true\n";
  TestDaemon d(tier::test::DaemonOptions::with_config(cfg));
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);  // mkdtemp made it 0700: other uids must reach the socket
  const std::string sock = d.socket();
  auto v = as(kOwner, [&]() -> std::vector<int64_t> {
    std::vector<int64_t> out;
    auto a = Client::connect(sock);
    if (!a) return {-1};
    Client& c1 = **a;
    (void)c1.create_pool("p1", {.ram_quota = 1 << 20});
    (void)c1.create_pool("p2", {.ram_quota = 1 << 20});
    out.push_back(
        code(c1.create_tensor("p1", {.name = "a", .size = 48 << 10, .shape = {}, .placement = {}})));
    // 48 KiB used of 64 KiB across the uid's pools: 32 KiB more in another pool do not fit.
    auto big = c1.create_tensor("p2", {.name = "b", .size = 32 << 10, .shape = {}, .placement = {}});
    out.push_back(code(big));
    out.push_back(!big && big.error().message().find("uid_ram_quota") != std::string::npos);
    out.push_back(
        code(c1.create_tensor("p2", {.name = "c", .size = 16 << 10, .shape = {}, .placement = {}})));
    // Waiting leases: c1 holds a write lease; another client may have one lease request
    // waiting, not two.
    auto t = c1.open_tensor("p1", "a");
    auto held = c1.lease(t->id, LeaseMode::kWrite);
    out.push_back(code(held));
    auto raw = RawClient::connect(sock);
    if (!raw) return {-2};
    (void)raw->send(MsgType::kLease, LeaseReq{static_cast<uint8_t>(LeaseMode::kRead), -1, {t->id}});
    out.push_back(code(raw->lease(LeaseMode::kRead, {t->id}, 10000)));
    // Connections: c1 and raw, plus one more, reach the limit of 3; the next is refused at Hello.
    auto c3 = Client::connect(sock), c4 = Client::connect(sock);
    out.push_back(code(c3));
    out.push_back(code(c4));
    out.push_back(!c4 && c4.error().message().find("max_connections_per_uid") != std::string::npos);
    raw->close();  // a closed connection frees its slot (once the daemon has seen the close)
    int64_t again = -1;
    for (int i = 0; i < 200 && again != 0; ++i) {
      again = code(Client::connect(sock));
      if (again != 0) ::usleep(20000);
    }
    out.push_back(again);
    return out;
  });
  const int64_t OK = 0, FULL = c(Code::kResourceExhausted);
  CHECK(v == std::vector<int64_t>{OK, FULL, 1, OK, OK, FULL, OK, FULL, 1, OK});
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

TEST_CASE("ArenaPin: the owner and group readers may pin an arena's range, strangers may not") {
  char tmpl[] = "/tmp/tier-tenancy.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string cfg = write_config(tmpl, "remove_arenas_on_exit = true\n");
  std::string nvme = std::string(tmpl) + "/nvme";  // with an NVMe tier pins are recorded
  std::filesystem::create_directories(nvme);
  auto opts = tier::test::DaemonOptions::with_config(cfg);
  opts.extra_args.insert(opts.extra_args.end(), {"--nvme-dir", nvme});
  TestDaemon d(opts);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  const std::string sock = d.socket();
  auto made = as(kOwner, [&]() -> std::vector<int64_t> {
    auto cl = Client::connect(sock);
    if (!cl) return {-1};
    if (!(*cl)->create_pool("shared",
                            {.ram_quota = 8 << 20, .nvme_quota = 0, .group = kReaders, .group_read = true}))
      return {-2};
    auto t = (*cl)->create_tensor("shared", {.name = "t", .size = 4096, .shape = {}, .placement = {}});
    if (!t) return {-3};
    auto l = (*cl)->lease(t->id, LeaseMode::kWrite);
    if (!l || !l->release().is_ok()) return {-4};
    auto arenas = (*cl)->mapped_arenas();
    if (arenas.size() != 1) return {-5};
    // The owner pins through its own mapping; a range past the arena's end is refused.
    Status mine = (*cl)->pin_for_dma({arenas[0].base, 4096}, true);
    auto rc = RawClient::connect(sock);
    if (!rc) return {-6};
    auto past = rc->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arenas[0].arena_id, arenas[0].size, 1, true});
    return {static_cast<int64_t>(arenas[0].arena_id), code(mine), code(past)};
  });
  REQUIRE(made.size() == 3);
  CHECK(made[1] == 0);
  CHECK(made[2] == c(Code::kInvalidArgument));
  const uint64_t arena = static_cast<uint64_t>(made[0]);
  auto pin_as = [&](const Who& w) {
    return as(w, [&]() -> std::vector<int64_t> {
      auto rc = RawClient::connect(sock);
      if (!rc) return {-1};
      return {code(rc->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4096, true})),
              code(rc->call<Empty>(MsgType::kArenaPin, ArenaPinReq{arena, 0, 4096, false}))};
    });
  };
  CHECK(pin_as(kReader) == std::vector<int64_t>{0, 0});
  CHECK(pin_as(kStranger) == std::vector<int64_t>{c(Code::kPermissionDenied), c(Code::kPermissionDenied)});
  std::filesystem::remove_all(tmpl);
}
