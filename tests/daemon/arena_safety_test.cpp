// Arena safety: what a tenant (uid 65534) can do to the shared memory it reaches, and what a
// squatter can do before tierd starts. Every case runs in a private mount + IPC namespace with
// its own fresh tmpfs on /dev/shm (the simulated reboot mounts another), so nothing is left
// behind and the node's /dev/shm is never touched. Needs root (as CI runs).
//
// - the SIGBUS guard: an arena truncated under tierd's mapping reads zeros, is not a crash;
// - a tenant truncating its arena through its MapArena fd, then evicting: tierd keeps running;
// - an arena damaged while tierd was down fails that pool only; the others come up;
// - a squatted arena name after a reboot is not re-attached, the snapshot is restored and the
//   squatter reads nothing of root's;
// - arena identity checks (names, owner, mode, symlinks, sizes);
// - arenas on a 2-node topology grow with what is placed, not one quota per node;
// - a /dev/shm smaller than the RAM tier is refused with how to raise it;
// - an arena does not grow past the free space of /dev/shm (an error, not a SIGBUS later).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ram/arena.hpp"
#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"
#include "support/tenant.hpp"

using namespace tier;
using namespace tier::wire;
using tier::test::access_tensor;
using tier::test::as_nobody;
using tier::test::DaemonOptions;
using tier::test::fresh_shm;
using tier::test::must_connect;
using tier::test::RawClient;
using tier::test::TestDaemon;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

DaemonOptions opts(std::vector<std::string> extra = {}) {
  DaemonOptions o;
  o.ram = "512M";
  o.extra_args = std::move(extra);
  return o;
}

// The object path ("/tierd-...") of pool `pool`'s arena on `node`, from the daemon's log.
std::string arena_path(const TestDaemon& d, const std::string& pool, int node = 0) {
  std::string log = d.log();
  std::string key = "pool '" + pool + "': arena ";
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    size_t b = at + key.size(), e = log.find(' ', b);
    std::string path = log.substr(b, e - b);
    if (log.compare(e, 10, " on node " + std::to_string(node)) == 0) return path;
  }
  FAIL("no arena of pool '" << pool << "' on node " << node << " in the log:\n" << log);
  return {};
}

std::vector<std::string> shm_arenas() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().starts_with("tierd-")) out.push_back(e.path().string());
  return out;
}

// Every page of the Metrics reply, as `c` may see it.
std::string metrics(RawClient& c) {
  std::string text;
  for (uint32_t page = 0; page < 1000; ++page) {
    auto m = c.call<TextRep>(MsgType::kMetrics, MetricsReq{page});
    REQUIRE(m);
    text += m->text;
    if (!m->more) break;
  }
  return text;
}

bool status_ok(const TestDaemon& d) {
  auto c = RawClient::connect(d.socket());
  return c && c->call<StatusRep>(MsgType::kStatus, Empty{}).has_value();
}

// A directory under /tmp, removed with its contents when the test case ends (or fails).
struct TmpDir {
  std::string path;
  explicit TmpDir(const char* what) : path("/tmp/tierd-" + std::string(what) + ".XXXXXX") {
    REQUIRE(::mkdtemp(path.data()) != nullptr);
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("the SIGBUS guard turns an arena truncated under tierd's mapping into zeros, not a crash") {
  fresh_shm();
  daemon::ArenaSpec spec{"tierd-guardtst", 1, 0, 8 * kMiB, daemon::HugePages::kNone, {}, false, {}, 0};
  auto a = daemon::Arena::create(spec);
  REQUIRE(a);
  REQUIRE((*a)->commit(4 * kMiB));
  std::memset((*a)->base(), 0x7f, 4 * kMiB);
  // What a tenant can do through the fd MapArena passes it.
  REQUIRE(::ftruncate((*a)->fd(), 0) == 0);
  volatile unsigned char* p = reinterpret_cast<unsigned char*>((*a)->base());
  CHECK(p[3 * kMiB] == 0);  // without the guard: SIGBUS, and this test dies
  CHECK((*a)->repairs() == 1);
  struct stat sb;
  REQUIRE(::fstat((*a)->fd(), &sb) == 0);
  CHECK(static_cast<uint64_t>(sb.st_size) == (*a)->committed());
  CHECK((*a)->unlink());
}

TEST_CASE("an arena grows only within the free space of its tmpfs, and says so past it") {
  fresh_shm("64m");
  // Another user of /dev/shm holds 40 MiB of its 64.
  const std::string other = "/dev/shm/not-tierd";
  {
    int fd = ::open(other.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::posix_fallocate(fd, 0, static_cast<off_t>(40 * kMiB)) == 0);
    ::close(fd);
  }
  daemon::ArenaSpec spec{"tierd-freetst0", 1, 0, 256 * kMiB, daemon::HugePages::kNone, {}, false, {}, 0};
  auto a = daemon::Arena::create(spec);
  REQUIRE(a);
  REQUIRE((*a)->commit(8 * kMiB));
  std::memset((*a)->base(), 0x11, 8 * kMiB);
  // Without the check this ftruncate succeeds (sparse) and the memset below is a SIGBUS.
  Status s = (*a)->commit(48 * kMiB);
  CHECK(s.code() == Code::kResourceExhausted);
  CHECK(s.message().find("free in its tmpfs") != std::string::npos);
  CHECK((*a)->committed() == 8 * kMiB);
  // What fits is committed, the growth's slack cut to the free space: every page is usable.
  REQUIRE((*a)->commit(20 * kMiB));
  CHECK((*a)->committed() >= 20 * kMiB);
  CHECK((*a)->committed() <= 24 * kMiB);
  std::memset((*a)->base(), 0x22, (*a)->committed());
  CHECK((*a)->unlink());
  CHECK(::unlink(other.c_str()) == 0);
}

TEST_CASE("a tenant truncating its own arena through its fd and evicting cannot stop tierd") {
  fresh_shm();
  TmpDir nvme("guard-nvme");
  TestDaemon d(opts({"--nvme-dir", nvme.path}));
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  RawClient root = must_connect(d);
  REQUIRE(root.pool_create("rootpool", 64 * kMiB));
  auto rt = root.tensor_create("rootpool", "w", 2 * kMiB);
  REQUIRE(rt);
  REQUIRE(access_tensor(root, rt->id, true, 0x5a) == 0);

  int rc = as_nobody([&] {
    auto c = RawClient::connect(d.socket());
    if (!c) return 10;
    if (!c->pool_create("nobodypool", 64 * kMiB)) return 11;
    auto t = c->tensor_create("nobodypool", "t", 4 * kMiB);
    if (!t) return 12;
    if (access_tensor(*c, t->id, true, 0xab) != 0) return 13;
    auto l = c->lease(LeaseMode::kRead, {t->id}, 5000);
    if (!l) return 14;
    int fd = -1;
    auto m = c->call<MapArenaRep>(MsgType::kMapArena, MapArenaReq{l->grants[0].arena_id}, &fd);
    if (!m || fd < 0) return 15;
    if (!c->release({l->grants[0].lease_id})) return 16;
    // The attack: the fd is read-write (a shared writable mapping needs that), so ftruncate
    // works whoever owns the object.
    if (::ftruncate(fd, 0) != 0) return 17;
    ::close(fd);
    // tierd reads the tensor to write it back (checksum, copy): before the guard, SIGBUS.
    (void)c->call<Empty>(MsgType::kEvict, TensorIdsReq{"nobodypool", {t->id}});
    auto back = c->lease(LeaseMode::kRead, {t->id}, 5000);     // fetched back from NVMe
    if (!back && back.error().code() == Code::kIo) return 18;  // the connection is gone
    if (!c->call<StatusRep>(MsgType::kStatus, Empty{})) return 19;
    return 0;
  });
  CHECK(rc == 0);
  CHECK(::kill(d.pid(), 0) == 0);
  CHECK(status_ok(d));
  CHECK(d.log().find("was truncated through a tenant's fd") != std::string::npos);
  // Root's pool is untouched and still served; the repair shows against the tenant's pool.
  RawClient again = must_connect(d);
  CHECK(access_tensor(again, rt->id, false, 0x5a) == 0);
  std::string m = metrics(again);
  CHECK(m.find("tierd_pool_arena_repairs{pool=\"rootpool\",uid=\"0\"} 0") != std::string::npos);
  CHECK(m.find("tierd_pool_arena_repairs{pool=\"nobodypool\",uid=\"65534\"} 0") == std::string::npos);
  CHECK(m.find("tierd_pool_arena_repairs{pool=\"nobodypool\",uid=\"65534\"} ") != std::string::npos);
  d.stop();
}

TEST_CASE(
    "an arena damaged while tierd was down fails its pool only: restored from the snapshot, the others come "
    "up") {
  fresh_shm();
  TestDaemon d(opts());
  uint64_t ta = 0, tb = 0;
  {
    RawClient c = must_connect(d);
    REQUIRE(c.pool_create("a", 32 * kMiB));
    REQUIRE(c.pool_create("b", 32 * kMiB));
    auto a = c.tensor_create("a", "x", 4 * kMiB);
    auto b = c.tensor_create("b", "y", 4 * kMiB);
    REQUIRE(a);
    REQUIRE(b);
    ta = a->id;
    tb = b->id;
    REQUIRE(access_tensor(c, ta, true, 0x11) == 0);
    REQUIRE(c.call<SnapshotRep>(MsgType::kSnapshot, PoolNameReq{"a"}));
    REQUIRE(access_tensor(c, ta, true, 0x12) == 0);  // after the snapshot: lost with the arena
    REQUIRE(access_tensor(c, tb, true, 0x22) == 0);
  }
  std::string damaged = "/dev/shm" + arena_path(d, "a");
  d.kill9();
  REQUIRE(::truncate(damaged.c_str(), 0) == 0);  // as a tenant's ftruncate would have left it
  d.start();
  REQUIRE(d.wait_ready());  // before: exit 1, "arena ... has 0 bytes, the journal recorded ..."
  CHECK(d.log().find("it is not used") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(damaged));
  RawClient c = must_connect(d);
  CHECK(access_tensor(c, ta, false, 0x11) == 0);  // from the snapshot
  CHECK(access_tensor(c, tb, false, 0x22) == 0);  // pool b re-attached with its bytes
  // The replacement arena is journaled: a plain restart re-attaches it.
  REQUIRE(access_tensor(c, ta, true, 0x13) == 0);
  d.kill9();
  d.start();
  REQUIRE(d.wait_ready());
  RawClient c2 = must_connect(d);
  CHECK(access_tensor(c2, ta, false, 0x13) == 0);
  d.stop();
}

TEST_CASE(
    "a squatted arena name after a reboot is not re-attached, root's snapshot comes back and the squatter "
    "reads nothing") {
  fresh_shm();
  TestDaemon d(opts());
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  uint64_t t = 0;
  {
    RawClient c = must_connect(d);
    REQUIRE(c.pool_create("p", 32 * kMiB));
    auto x = c.tensor_create("p", "x", 4 * kMiB);
    REQUIRE(x);
    t = x->id;
    REQUIRE(access_tensor(c, t, true, 0x33) == 0);
    REQUIRE(c.call<SnapshotRep>(MsgType::kSnapshot, PoolNameReq{"p"}));
  }
  // The squatter knows the very name tierd recorded (the strongest case: it leaked).
  std::string name = arena_path(d, "p");
  d.kill9();
  fresh_shm();  // the reboot

  // The squatter creates the object first, mode 0666, the right size, and keeps it mapped.
  int go[2], res[2];
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(res) == 0);
  pid_t squatter = ::fork();
  REQUIRE(squatter >= 0);
  if (squatter == 0) {
    ::close(go[1]);
    ::close(res[0]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(100);
    ::umask(0);
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
    if (fd < 0 || ::ftruncate(fd, 32 * kMiB) != 0) _exit(101);
    auto* p = static_cast<unsigned char*>(::mmap(nullptr, 32 * kMiB, PROT_READ, MAP_SHARED, fd, 0));
    if (p == MAP_FAILED) _exit(102);
    char ready = 1;
    (void)!::write(res[1], &ready, 1);
    char cmd = 0;
    (void)!::read(go[0], &cmd, 1);  // root has written new data
    int found = 0;
    for (uint64_t i = 0; i < 32 * kMiB; ++i) found += p[i] == 0x44 || p[i] == 0x33;
    (void)!::write(res[1], &found, sizeof found);
    _exit(0);
  }
  ::close(go[0]);
  ::close(res[1]);
  char ready = 0;
  REQUIRE(::read(res[0], &ready, 1) == 1);

  d.start();
  REQUIRE(d.wait_ready());
  CHECK(d.log().find("not one tierd created") != std::string::npos);
  CHECK(d.log().find("0 arenas re-attached") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));  // removed, not used
  RawClient c = must_connect(d);
  CHECK(access_tensor(c, t, false, 0x33) == 0);  // restored from the snapshot, not zeros
  auto y = c.tensor_create("p", "y", 4 * kMiB);
  REQUIRE(y);
  REQUIRE(access_tensor(c, y->id, true, 0x44) == 0);
  REQUIRE(access_tensor(c, t, true, 0x44) == 0);

  char cmd = 1;
  REQUIRE(::write(go[1], &cmd, 1) == 1);
  int found = -1;
  REQUIRE(::read(res[0], &found, sizeof found) == sizeof found);
  int st = 0;
  ::waitpid(squatter, &st, 0);
  CHECK(found == 0);  // nothing of root's in the squatter's object
  // Nor can uid 65534 open any arena now in /dev/shm.
  std::vector<std::string> arenas = shm_arenas();
  CHECK_FALSE(arenas.empty());
  int opened = as_nobody([&] {
    int n = 0;
    for (const std::string& a : arenas) {
      int fd = ::open(a.c_str(), O_RDONLY);
      if (fd >= 0) ++n, ::close(fd);
    }
    return n;
  });
  CHECK(opened == 0);
  ::close(go[1]);
  ::close(res[0]);
  d.stop();
}

TEST_CASE(
    "arena identity: only a well-named, tierd-owned 0600 regular file of the right size is re-attached") {
  using daemon::arena_name_matches;
  std::array<uint8_t, 16> id{};
  id[0] = 0xab;
  id[15] = 0x01;
  std::string n = daemon::arena_object_name("tierd-1a2b3c4d", 7, 1, id);
  CHECK(n == "tierd-1a2b3c4d-p7-n1-ab000000000000000000000000000001");
  CHECK(arena_name_matches(n, "tierd-1a2b3c4d", 7, 1));
  CHECK_FALSE(arena_name_matches(n, "tierd-1a2b3c4d", 7, 0));
  CHECK_FALSE(arena_name_matches(n, "tierd-1a2b3c4d", 77, 1));
  CHECK_FALSE(arena_name_matches("tierd-1a2b3c4d-p7-n1", "tierd-1a2b3c4d", 7, 1));  // guessable
  CHECK_FALSE(arena_name_matches(n + "0", "tierd-1a2b3c4d", 7, 1));
  CHECK_FALSE(
      arena_name_matches("tierd-1a2b3c4d-p7-n1-AB000000000000000000000000000001", "tierd-1a2b3c4d", 7, 1));

  struct stat sb{};
  sb.st_mode = S_IFREG | 0600;
  sb.st_uid = 0;
  sb.st_nlink = 1;
  CHECK(daemon::check_arena_identity(sb, 0));
  struct stat other = sb;
  other.st_uid = 65534;
  CHECK(daemon::check_arena_identity(other, 0).code() == Code::kPermissionDenied);
  other = sb;
  other.st_mode = S_IFREG | 0666;
  CHECK(daemon::check_arena_identity(other, 0).code() == Code::kPermissionDenied);
  other.st_mode = S_IFREG | 0400;
  CHECK(daemon::check_arena_identity(other, 0).code() == Code::kPermissionDenied);
  other = sb;
  other.st_mode = S_IFIFO | 0600;
  CHECK(daemon::check_arena_identity(other, 0).code() == Code::kPermissionDenied);
  other = sb;
  other.st_nlink = 2;
  CHECK(daemon::check_arena_identity(other, 0).code() == Code::kPermissionDenied);

  // attach() on real objects.
  fresh_shm();
  daemon::ArenaSpec spec{"tierd-idtest00", 3, 0, 16 * kMiB, daemon::HugePages::kNone, {}, false, {}, 0};
  auto a = daemon::Arena::create(spec);
  REQUIRE(a);
  REQUIRE((*a)->commit(4 * kMiB));
  std::string path = (*a)->path();
  std::string file = "/dev/shm" + path;
  struct stat made;
  REQUIRE(::stat(file.c_str(), &made) == 0);
  CHECK((made.st_mode & 07777) == 0600);
  CHECK(made.st_uid == ::geteuid());
  a->reset();
  spec.path = path;
  spec.min_size = 4 * kMiB;
  CHECK(daemon::Arena::attach(spec));
  spec.min_size = 8 * kMiB;  // a journaled extent past its end: truncated
  CHECK(daemon::Arena::attach(spec).error().code() == Code::kCorruption);
  spec.min_size = 0;
  REQUIRE(::chmod(file.c_str(), 0644) == 0);
  CHECK(daemon::Arena::attach(spec).error().code() == Code::kPermissionDenied);
  REQUIRE(::chmod(file.c_str(), 0600) == 0);
  REQUIRE(::chown(file.c_str(), 65534, 65534) == 0);
  CHECK(daemon::Arena::attach(spec).error().code() == Code::kPermissionDenied);
  REQUIRE(::chown(file.c_str(), 0, 0) == 0);
  CHECK(daemon::Arena::attach(spec));
  // A symlink under the recorded name, to an object that passes every other check.
  std::string link_name = daemon::arena_object_name("tierd-idtest00", 3, 0, id);
  REQUIRE(::symlink(file.c_str(), ("/dev/shm/" + link_name).c_str()) == 0);
  spec.path = "/" + link_name;
  CHECK(daemon::Arena::attach(spec).error().code() == Code::kPermissionDenied);
  spec.path = "/tierd-idtest00-p3-n0";  // not a name tierd gives
  CHECK(daemon::Arena::attach(spec).error().code() == Code::kPermissionDenied);
  ::unlink(("/dev/shm/" + link_name).c_str());
  ::unlink(file.c_str());
}

TEST_CASE("on two NUMA nodes a pool's arenas hold what is placed on each, not a quota per node") {
  fresh_shm();
  TestDaemon d(opts({"--topology-synthetic", "pack:2 numa:1 core:1 pu:1"}));
  RawClient c = must_connect(d);
  const uint64_t quota = 256 * kMiB;
  REQUIRE(c.pool_create("big", quota));
  for (int i = 0; i < 3; ++i) REQUIRE(c.tensor_create("big", "n0-" + std::to_string(i), 16 * kMiB, 1, 0));
  auto t1 = c.tensor_create("big", "n1", 16 * kMiB, 1, 1);
  REQUIRE(t1);
  REQUIRE(access_tensor(c, t1->id, true, 0x66) == 0);
  uint64_t total = 0;
  std::vector<std::string> arenas = shm_arenas();
  CHECK(arenas.size() == 2);
  for (const std::string& a : arenas) {
    struct stat sb;
    REQUIRE(::stat(a.c_str(), &sb) == 0);
    total += static_cast<uint64_t>(sb.st_size);
  }
  CHECK(total >= 64 * kMiB);                             // what is placed
  CHECK(total <= 64 * kMiB + 64 * kMiB / 4 + 4 * kMiB);  // plus the growth step, not 2 x 256 MiB
  // A restart re-attaches the partly grown arenas with their bytes.
  d.kill9();
  d.start();
  REQUIRE(d.wait_ready());
  CHECK(d.log().find("2 arenas re-attached") != std::string::npos);
  RawClient c2 = must_connect(d);
  CHECK(access_tensor(c2, t1->id, false, 0x66) == 0);
  d.stop();
}

TEST_CASE(
    "a /dev/shm smaller than the RAM tier is refused at start and by --check-config, saying how to raise "
    "it") {
  TmpDir dir("shm-small");
  const std::string& state = dir.path;
  auto run = [&](const std::string& extra, std::string& out) {
    std::string cmd = tier::test::bin_path("tierd") + " --state-dir " + state + " --socket " + state +
                      "/s.sock --ram 128M" + extra + " 2>&1";
    FILE* f = ::popen(cmd.c_str(), "r");
    REQUIRE(f);
    out.clear();
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
    int st = ::pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  std::string out;
  fresh_shm("64m");
  for (const std::string& extra : {std::string(" --check-config"), std::string()}) {
    int rc = run(extra, out);
    INFO(out);
    CHECK(rc == 2);
    CHECK(out.find("does not fit in /dev/shm") != std::string::npos);
    CHECK(out.find("mount -o remount,size=1G /dev/shm") != std::string::npos);
  }
  // Within rounding of the tier (1/64 of it) passes, as ram = "50%" against a half-RAM tmpfs.
  fresh_shm("127m");
  int rc = run(" --check-config", out);
  INFO(out);
  CHECK(rc == 0);
}
