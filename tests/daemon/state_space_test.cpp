// The state dir's space (daemon/durability/state_space.hpp, issue 33 finding 3): snapshots are charged to
// the pool's NVMe quota, refused below a free-space floor, and a full disk never stops tierd.
// The full-disk case needs root: a private mount namespace with a small loop-mounted ext4 as
// the state dir, the tenant as uid 65534.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"
#include "support/tenant.hpp"

using namespace tier;
using namespace tier::wire;
using tier::test::access_tensor;
using tier::test::as_nobody;
using tier::test::DaemonOptions;
using tier::test::must_connect;
using tier::test::RawClient;
using tier::test::TestDaemon;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

Result<SnapshotRep> snapshot(RawClient& c, const std::string& pool, uint32_t keep) {
  return c.call<SnapshotRep>(MsgType::kSnapshotTake, SnapshotTakeReq{pool, 0, keep});
}

// A small ext4 loop-mounted on `dir` in this process's own mount namespace; unmounted (and
// the loop device freed: autoclear) when it goes. `ok` is false when it could not be made.
struct SmallFs {
  std::string dir;
  bool ok = false;
  SmallFs(const std::string& image, const std::string& mountpoint, const char* size) : dir(mountpoint) {
    static bool entered = false;
    if (!entered) {
      if (::unshare(CLONE_NEWNS) != 0) return;
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return;
      entered = true;
    }
    const std::string mk = "truncate -s " + std::string(size) + " '" + image + "' && mkfs.ext4 -q -F -m 0 '" +
                           image + "' >/dev/null 2>&1 && mount -o loop '" + image + "' '" + dir + "'";
    ok = std::system(mk.c_str()) == 0;
  }
  ~SmallFs() {
    if (ok) (void)::umount2(dir.c_str(), MNT_DETACH);
  }
};

bool can_loop_mount() {
  return ::geteuid() == 0 && ::access("/dev/loop-control", R_OK | W_OK) == 0 &&
         std::system("command -v mkfs.ext4 >/dev/null 2>&1") == 0;
}

}  // namespace

TEST_CASE("snapshots are charged to the pool's NVMe quota", "[daemon][snapshot][quota]") {
  TestDaemon d;
  RawClient c = must_connect(d);
  PoolCreateReq pr;
  pr.name = "charged";
  pr.ram_quota = 64 * kMiB;
  pr.nvme_quota = 10 * kMiB;
  REQUIRE(c.call<PoolInfoW>(MsgType::kPoolCreate, pr));
  REQUIRE(c.tensor_create("charged", "w", 3 * kMiB));
  // Three snapshots of about 3 MiB fit 10 MiB; the fourth is refused, naming the quota.
  for (int i = 0; i < 3; ++i) {
    INFO("snapshot " << i);
    auto s = snapshot(c, "charged", 16);
    REQUIRE(s);
  }
  auto refused = snapshot(c, "charged", 16);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == Code::kResourceExhausted);
  INFO(refused.error().message());
  CHECK(refused.error().message().find("NVMe quota") != std::string::npos);
  // keep = 1 drops the older ones once it is durable, but they still count while it is written.
  REQUIRE_FALSE(snapshot(c, "charged", 1));
}

// What the snapshots of `pool` take on disk (allocated blocks) under the state dir.
uint64_t snapshot_disk_bytes(const TestDaemon& d, const std::string& pool) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(d.state_dir() + "/snapshots/" + pool, ec)) {
    struct stat st{};
    if (::lstat(e.path().c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

TEST_CASE("snapshots are charged what they take on disk until dropped and across a restart",
          "[daemon][snapshot][quota]") {
  // 600 tensors of 16 bytes with long names: the data is 9.4 KiB, the manifests most of a
  // snapshot. Before: only the data was charged, and 16 kept snapshots took 3 MiB of disk
  // against the pool's NVMe quota of 1 MiB.
  DaemonOptions o;
  o.extra_args = {"--remove-arenas-on-exit"};
  TestDaemon d(o);
  auto c = std::make_unique<RawClient>(must_connect(d));
  PoolCreateReq pr;
  pr.name = "names";
  pr.ram_quota = 16 * kMiB;
  pr.nvme_quota = kMiB;
  REQUIRE(c->call<PoolInfoW>(MsgType::kPoolCreate, pr));
  std::vector<std::string> names;
  for (int i = 0; i < 600; ++i) {
    names.push_back("t" + std::to_string(i) + "-" + std::string(240, 'x'));
    REQUIRE(c->tensor_create("names", names.back(), 16));
  }
  int taken = 0;
  for (; taken < 16; ++taken)
    if (!snapshot(*c, "names", 16)) break;
  INFO("snapshots taken " << taken << ", on disk " << snapshot_disk_bytes(d, "names"));
  CHECK(taken >= 1);
  CHECK(taken < 16);
  CHECK(snapshot_disk_bytes(d, "names") <= kMiB);

  // A restart charges the kept snapshots again, from what they take on disk.
  c.reset();
  REQUIRE(d.stop() == 0);
  d.start();
  REQUIRE(d.wait_ready());
  c = std::make_unique<RawClient>(must_connect(d));
  auto again = snapshot(*c, "names", 16);
  REQUIRE_FALSE(again);
  CHECK(again.error().message().find("NVMe quota") != std::string::npos);

  // The pool changes (all but one tensor deleted): its old snapshots still count. A snapshot
  // keeping 1 fits, and the old ones' charge goes with them.
  for (size_t i = 1; i < names.size(); ++i)
    REQUIRE(c->call<Empty>(MsgType::kTensorDelete, TensorRefReq{"names", names[i]}));
  REQUIRE(snapshot(*c, "names", 1));
  for (int i = 0; i < 15; ++i) {
    INFO("small snapshot " << i);
    REQUIRE(snapshot(*c, "names", 16));
  }
  c.reset();
  d.stop();
}

TEST_CASE("a tenant's snapshots cannot fill the state dir: tierd serves the victim and loses nothing",
          "[daemon][snapshot][integrity][root]") {
  if (!can_loop_mount()) {
    WARN("SKIPPED: needs root, loop devices and mkfs.ext4");
    return;
  }
  DaemonOptions o;
  o.ram = "256M";
  o.config = "snapshot_free_floor = \"8M\"\njournal_reserve = \"4M\"\n";
  TestDaemon d(o);
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);  // the tenant reaches the socket
  REQUIRE(d.stop() == 0);
  // Mounted over the state dir, which starts empty: a 48 MiB file system holds the journal,
  // the reserve and the snapshots.
  SmallFs fs(d.dir() + "/state.img", d.state_dir(), "48M");
  REQUIRE(fs.ok);
  d.start();
  REQUIRE(d.wait_ready());

  RawClient victim = must_connect(d);
  REQUIRE(victim.pool_create("victim", 32 * kMiB));
  std::vector<std::pair<uint64_t, unsigned char>> acked;  // tensor id, pattern
  auto victim_tensor = [&](int i) {
    auto t = victim.tensor_create("victim", "v" + std::to_string(i), 256 << 10);
    INFO(d.log());
    REQUIRE(t);
    const auto pattern = static_cast<unsigned char>(0x40 + i);
    REQUIRE(access_tensor(victim, t->id, true, pattern) == 0);
    acked.emplace_back(t->id, pattern);
  };
  victim_tensor(0);

  // The tenant snapshots an 8 MiB pool, keeping 16, until it is refused.
  const std::string socket = d.socket();
  int rc = as_nobody([&] {
    auto c = RawClient::connect(socket);
    if (!c || !c->pool_create("hog", 16 * kMiB)) return 10;
    for (int i = 0; i < 2; ++i) {
      auto t = c->tensor_create("hog", "h" + std::to_string(i), 4 * kMiB);
      if (!t || access_tensor(*c, t->id, true, 0x5a) != 0) return 11;
    }
    for (int n = 0; n < 64; ++n) {
      auto s = snapshot(*c, "hog", 16);
      if (s) continue;
      if (n == 0) return 12;  // the first one fits
      if (s.error().code() != Code::kResourceExhausted) return 13;
      return s.error().message().find("snapshot_free_floor") != std::string::npos ? 0 : 14;
    }
    return 15;  // never refused
  });
  INFO(d.log());
  CHECK(rc == 0);
  REQUIRE(d.running());
  REQUIRE(::kill(d.pid(), 0) == 0);
  for (int i = 1; i < 4; ++i) victim_tensor(i);  // served

  // Something else fills the disk to the last block: the journal's reserve carries on.
  {
    const std::string filler = d.state_dir() + "/filler";
    int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    std::vector<char> block(1 << 16, 1);
    while (::write(fd, block.data(), block.size()) > 0) {}
    while (::write(fd, block.data(), 4096) > 0) {}
    ::fsync(fd);
    ::close(fd);
  }
  for (int i = 4; i < 40; ++i) victim_tensor(i);  // each create journals a record
  REQUIRE(::kill(d.pid(), 0) == 0);
  CHECK(d.log().find("released the journal's reserve") != std::string::npos);
  auto refused = snapshot(victim, "victim", 1);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == Code::kResourceExhausted);

  // Nothing acknowledged is lost: after a restart (once there is room again) every tensor is
  // there with its bytes.
  victim.close();
  REQUIRE(d.stop() == 0);
  REQUIRE(::unlink((d.state_dir() + "/filler").c_str()) == 0);
  d.start();
  REQUIRE(d.wait_ready());
  RawClient again = must_connect(d);
  for (const auto& [id, pattern] : acked) {
    INFO("tensor " << id);
    CHECK(access_tensor(again, id, false, pattern) == 0);
  }
  again.close();
  d.stop();
}
