// Pool snapshots end to end (docs/daemon.md "Snapshots"): a snapshot is a complete
// point-in-time image whatever tier each tensor is on (a simulated reboot restores tensors that
// were only on NVMe when it was taken), it streams off the event loop in bounded memory while
// other clients are served, partial snapshots left by kill -9 are removed at start-up, and the
// snapshot directories are private (0700).
//
// A simulated reboot: the test process enters a private IPC + mount namespace with a fresh
// tmpfs on /dev/shm (fresh_boot()); the daemons it starts live there. Needs root.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "snapshot_util.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"
#include "base/errors.hpp"

using namespace tier;
using tier::test::DaemonOptions;
using tier::test::TestDaemon;
namespace fs = std::filesystem;
using namespace tier::test::snap;

namespace {

// The data file of the snapshot of `pool` being written, once its writer has made it; empty
// when `done` turns true first (or after about 10 s).
std::string snapshot_data_file(const TestDaemon& d, const std::string& pool, const std::atomic<bool>& done) {
  for (int i = 0; i < 5000 && !done; ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d.state_dir() + "/snapshots/" + pool, ec))
      if (fs::exists(e.path() / "data")) return (e.path() / "data").string();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return {};
}

// A pool of `n` tensors of `size` bytes named <prefix><i>, each written once; their hashes.
std::map<std::string, uint64_t> fill_pool(Client& c, const std::string& pool, const std::string& prefix,
                                          int n, size_t size) {
  REQUIRE(c.create_pool(pool, {.ram_quota = static_cast<uint64_t>(n) * size}).has_value());
  std::map<std::string, uint64_t> hashes;
  for (int i = 0; i < n; ++i)
    hashes[prefix + std::to_string(i)] = put(c, pool, prefix + std::to_string(i), size, 1);
  return hashes;
}

unsigned mode_of(const std::string& p) {
  struct stat sb{};
  REQUIRE(::stat(p.c_str(), &sb) == 0);
  return sb.st_mode & 07777;
}

// Whether uid 65534 can list `dir` (a forked child drops to it and tries).
bool nobody_can_list(const std::string& dir) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(2);
    DIR* d = ::opendir(dir.c_str());
    _exit(d ? 0 : 1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) != 2);
  return WEXITSTATUS(st) == 0;
}

}  // namespace

TEST_CASE("a snapshot covers tensors only on NVMe: after a reboot each reads its snapshot-time bytes") {
  fresh_boot();
  TempDir nvme("nvme");
  const DaemonOptions o = with_nvme(nvme, "128M");
  constexpr size_t kSize = 1 << 20;
  std::map<std::string, uint64_t> want;  // what each tensor must read after the reboot
  {
    TestDaemon d(o);
    auto c = connect_to(d);
    REQUIRE(c->create_pool("d4", {.ram_quota = 64 << 20}).has_value());
    std::map<std::string, uint64_t> ids;
    for (int i = 0; i < 24; ++i) {
      std::string n = "nv" + std::to_string(i);
      want[n] = put(*c, "d4", n, kSize, 1);
      ids[n] = c->open_tensor("d4", n)->id;
    }
    REQUIRE(c->evict("d4").is_ok());  // all 24 now only on NVMe
    for (int i = 0; i < 4; ++i) {     // and 4 only in RAM
      std::string n = "ram" + std::to_string(i);
      want[n] = put(*c, "d4", n, kSize, 1);
    }
    auto s = c->snapshot("d4");
    REQUIRE(s.has_value());
    CHECK(s->bytes == 28 * kSize);  // every tensor of the pool, whatever its tier
    // After the snapshot: 16 of the NVMe-only tensors are written again and stay in RAM (no
    // NVMe copy any more: a reboot brings back their snapshot bytes); 4 of those are then
    // written back (a journaled NVMe copy, newer than the snapshot: it wins).
    for (int i = 0; i < 16; ++i) {
      std::string n = "nv" + std::to_string(i);
      uint64_t h = write_version(*c, ids[n], n, 2);
      if (i >= 12) want[n] = h;
    }
    std::vector<uint64_t> back;
    for (int i = 12; i < 16; ++i) back.push_back(ids["nv" + std::to_string(i)]);
    REQUIRE(c->evict("d4", back).is_ok());
    c.reset();
    d.kill9();
    fresh_boot();  // the reboot: every arena is gone
    d.start();
    auto c2 = connect_to(d);
    for (const auto& [n, h] : want) {
      INFO(n);
      auto got = read_hash(*c2, "d4", n);
      REQUIRE(got.has_value());
      CHECK(*got == h);
    }
    CHECK(d.log().find("was only in RAM and not in a snapshot: lost") == std::string::npos);
  }
}

TEST_CASE("start-up removes partial snapshot directories and keeps the newest complete one") {
  fresh_boot();
  TestDaemon d;
  uint64_t h = 0;
  std::string root = d.state_dir() + "/snapshots";
  std::string kept;
  {
    auto c = connect_to(d);
    REQUIRE(c->create_pool("part", {.ram_quota = 16 << 20}).has_value());
    h = put(*c, "part", "t", 1 << 20, 1);
    auto s = c->snapshot("part");
    REQUIRE(s.has_value());
    kept = root + "/part/" + std::to_string(s->snapshot_id);
    // What kill -9 during a snapshot leaves: its data, no manifest (or only its temp file).
    std::string partial = root + "/part/" + std::to_string(s->snapshot_id + 1);
    fs::create_directories(partial);
    std::ofstream(partial + "/data") << std::string(1 << 20, 'x');
    fs::create_directories(root + "/part/" + std::to_string(s->snapshot_id + 2));
    std::ofstream(root + "/part/" + std::to_string(s->snapshot_id + 2) + "/manifest.tmp") << "torn";
    // A pool dropped while tierd died before its directory went.
    fs::create_directories(root + "/gone/7");
    std::ofstream(root + "/gone/7/data") << "x";
  }
  d.kill9();
  d.start();
  std::vector<std::string> left;
  for (const auto& e : fs::recursive_directory_iterator(root)) left.push_back(e.path().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{root + "/part", kept, kept + "/data", kept + "/manifest"});
  CHECK(d.log().find("3 partial snapshots removed") != std::string::npos);
  // The kept one is the snapshot a reboot restores from.
  d.kill9();
  fresh_boot();
  d.start();
  auto c = connect_to(d);
  auto got = read_hash(*c, "part", "t");
  REQUIRE(got.has_value());
  CHECK(*got == h);
}

TEST_CASE("kill -9 of tierd while a snapshot is written leaves no partial snapshot after the restart") {
  fresh_boot();
  DaemonOptions o;
  o.ram = "512M";
  TestDaemon d(o);
  {
    auto c = connect_to(d);
    fill_pool(*c, "kill", "k", 8, 32 << 20);
  }
  std::atomic<bool> answered{false};
  std::jthread snapper([&] {
    auto sc = Client::connect(
        d.socket(), {.client_name = "snapshotter", .reconnect_timeout = std::chrono::milliseconds(0)});
    if (sc) (void)(*sc)->snapshot("kill");
    answered = true;
  });
  std::string data = snapshot_data_file(d, "kill", answered);
  REQUIRE_FALSE(data.empty());
  std::string dir = fs::path(data).parent_path().string();
  d.kill9();
  snapper.join();
  d.start();
  // Gone, unless it had become a complete snapshot just before the kill.
  CHECK((!fs::exists(dir) || fs::exists(dir + "/manifest")));
  CHECK((fs::exists(dir) || d.log().find("removed snapshot directory " + dir) != std::string::npos));
}

TEST_CASE("snapshot directories are 0700 (also ones made 0755 before) and uid 65534 cannot list them") {
  fresh_boot();
  TestDaemon d;
  // An ordinary state dir is world-traversable (/var/lib/tierd is 0755): only the
  // snapshot directories' own modes keep pool names private.
  REQUIRE(::chmod(d.dir().c_str(), 0755) == 0);
  REQUIRE(::chmod(d.state_dir().c_str(), 0755) == 0);
  std::string root = d.state_dir() + "/snapshots";
  std::string snap;
  {
    auto c = connect_to(d);
    REQUIRE(c->create_pool("secret-pool-name", {.ram_quota = 16 << 20}).has_value());
    put(*c, "secret-pool-name", "t", 4096, 1);
    auto s = c->snapshot("secret-pool-name");
    REQUIRE(s.has_value());
    snap = root + "/secret-pool-name/" + std::to_string(s->snapshot_id);
  }
  const std::vector<std::string> dirs = {root, root + "/secret-pool-name", snap, d.state_dir() + "/journal"};
  for (const auto& p : dirs) {
    INFO(p);
    CHECK(mode_of(p) == 0700);
  }
  CHECK_FALSE(nobody_can_list(root));
  // Directories an older tierd left 0755 are made private at start-up.
  d.stop();
  for (const auto& p : dirs) REQUIRE(::chmod(p.c_str(), 0755) == 0);
  REQUIRE(nobody_can_list(root));
  d.start();
  for (const auto& p : dirs) {
    INFO(p);
    CHECK(mode_of(p) == 0700);
  }
  CHECK_FALSE(nobody_can_list(root));
}

TEST_CASE(
    "a large snapshot streams in bounded memory while the loop serves other clients, as a point-in-time "
    "image") {
  fresh_boot();
  DaemonOptions o;
  o.ram = "768M";
  TestDaemon d(o);
  constexpr size_t kSize = 64 << 20;
  constexpr int kTensors = 8;  // 512 MiB
  auto c = connect_to(d);
  std::map<std::string, uint64_t> want = fill_pool(*c, "big", "b", kTensors, kSize);
  fill_pool(*c, "other", "o", 1, 1 << 20);
  auto last = c->open_tensor("big", "b" + std::to_string(kTensors - 1));
  auto other = c->open_tensor("other", "o0");
  REQUIRE(last.has_value());
  REQUIRE(other.has_value());
  // Bounded memory: tierd may map at most 256 MiB more than it has now, half the pool. A
  // snapshot that stages the pool in memory cannot be taken.
  {
    std::ifstream st("/proc/" + std::to_string(d.pid()) + "/status");
    std::string line;
    uint64_t vm_kib = 0;
    while (std::getline(st, line))
      if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(line.substr(7));
    REQUIRE(vm_kib > 0);
    rlimit lim{(vm_kib << 10) + (uint64_t{256} << 20), (vm_kib << 10) + (uint64_t{256} << 20)};
    REQUIRE(::prlimit(d.pid(), RLIMIT_AS, &lim, nullptr) == 0);
  }
  std::atomic<bool> snapshot_answered{false};
  Result<SnapshotInfo> snap = fail(Code::kInternal, "not run");
  std::jthread snapper([&] {  // joined also when a REQUIRE below fails
    auto sc = Client::connect(
        d.socket(), {.client_name = "snapshotter", .reconnect_timeout = std::chrono::milliseconds(0)});
    if (sc) snap = (*sc)->snapshot("big");
    snapshot_answered = true;
  });
  // The snapshot is under way once its writer made its data file.
  (void)snapshot_data_file(d, "big", snapshot_answered);
  // While it streams, this client is served: a status, a lease in another pool, and a write to
  // the pool's last tensor (copied first, then written: the snapshot keeps its old bytes). The
  // write lease is fail-fast (timeout 0): the snapshot's pin is waited out, not a kBusy.
  REQUIRE(c->status().has_value());
  write_version(*c, other->id, "o0", 2);
  uint64_t newer = write_version(*c, last->id, last->name, 2, 0);
  bool served_during = !snapshot_answered.load();
  snapper.join();
  REQUIRE(snap.has_value());
  CHECK(snap->bytes == uint64_t{kTensors} * kSize);
  CHECK(served_during);
  CHECK(*read_hash(*c, "big", last->name) == newer);
  // The image is the pool at the snapshot's point: the data file holds the tensors in pool
  // order, and the last one's bytes are those from before the write. (The reboot restore
  // from such a file is the first test case's.)
  std::string file = d.state_dir() + "/snapshots/big/" + std::to_string(snap->snapshot_id) + "/data";
  REQUIRE(fs::file_size(file) == uint64_t{kTensors} * kSize);
  std::vector<std::byte> b(kSize);
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  CHECK(::pread(fd, b.data(), kSize, static_cast<off_t>((kTensors - 1) * kSize)) ==
        static_cast<ssize_t>(kSize));
  ::close(fd);
  CHECK(XXH3_64bits(b.data(), kSize) == want[last->name]);
}
