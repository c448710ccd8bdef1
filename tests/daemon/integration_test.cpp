// Integration tests: a real tierd on a temporary socket, driven through the wire protocol by
// RawClient (independent of libtier).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ram/arena.hpp"
#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"

using namespace tier;
using namespace tier::test;
using wire::MsgType;

namespace {

DaemonOptions opts(std::vector<std::string> extra = {}) {
  DaemonOptions o;
  o.extra_args = {"--remove-arenas-on-exit"};
  o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
  return o;
}

size_t shm_objects_with_prefix(const std::string& prefix) {
  size_t n = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  while (dirent* e = readdir(d))
    if (std::string(e->d_name).starts_with(prefix + "-")) ++n;
  closedir(d);
  return n;
}

RawClient must_connect(const TestDaemon& d, int32_t node = -1) {
  auto c = RawClient::connect(d.socket(), true, node);
  REQUIRE(c);
  return std::move(*c);
}

}  // namespace

TEST_CASE("pool, tensor, lease and mapped bytes round trip") {
  TestDaemon d(opts());
  RawClient c = must_connect(d);
  auto pool = c.pool_create("job", 64 << 20);
  REQUIRE(pool);
  CHECK(pool->owner_uid == getuid());
  auto t = c.tensor_create("job", "w0", 3 << 20);
  REQUIRE(t);
  CHECK(t->numa_node == 0);
  CHECK(t->tiers == kTierRam);

  auto lease = c.lease(LeaseMode::kWrite, {t->id});
  REQUIRE(lease);
  REQUIRE(lease->grants.size() == 1);
  const auto& g = lease->grants[0];
  CHECK(g.length == (3u << 20));
  CHECK(g.offset % (2u << 20) == 0);

  int fd = -1;
  auto map = c.call<wire::MapArenaRep>(MsgType::kMapArena, wire::MapArenaReq{g.arena_id}, &fd);
  REQUIRE(map);
  REQUIRE(fd >= 0);
  CHECK(map->size >= g.offset + g.length);
  void* p = mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  auto* bytes = static_cast<unsigned char*>(p) + g.offset;
  std::memset(bytes, 0xab, g.length);
  REQUIRE(c.release({g.lease_id}));

  // A second connection sees the same bytes.
  RawClient c2 = must_connect(d);
  auto rl = c2.lease(LeaseMode::kRead, {t->id});
  REQUIRE(rl);
  int fd2 = -1;
  auto map2 = c2.call<wire::MapArenaRep>(MsgType::kMapArena, wire::MapArenaReq{g.arena_id}, &fd2);
  REQUIRE(map2);
  void* p2 = mmap(nullptr, map2->size, PROT_READ, MAP_SHARED, fd2, 0);
  REQUIRE(p2 != MAP_FAILED);
  CHECK(static_cast<unsigned char*>(p2)[rl->grants[0].offset + 12345] == 0xab);
  munmap(p, map->size);
  munmap(p2, map2->size);
  close(fd);
  close(fd2);

  // Listing, status, and the NVMe-only requests.
  auto list = c.call<wire::TensorListRep>(MsgType::kTensorList, wire::TensorListReq{"job", 0, 0});
  REQUIRE(list);
  REQUIRE(list->tensors.size() == 1);
  CHECK(list->tensors[0].readers == 1);
  auto st = c.call<wire::StatusRep>(MsgType::kStatus, wire::Empty{});
  REQUIRE(st);
  CHECK(st->pools == 1);
  CHECK(st->leases == 1);
  CHECK(st->clients == 2);
  auto ev = c.call<wire::Empty>(MsgType::kEvict, wire::TensorIdsReq{"job", {}});
  REQUIRE(!ev);
  CHECK(ev.error().code() == Code::kUnsupported);
  auto m = c.call<wire::TextRep>(MsgType::kMetrics, wire::Empty{});
  REQUIRE(m);
  CHECK(m->text.find("tierd_leases 1") != std::string::npos);

  // Drop refuses while leased, then succeeds and removes the arena.
  auto drop = c.call<wire::Empty>(MsgType::kPoolDrop, wire::PoolNameReq{"job"});
  REQUIRE(!drop);
  CHECK(drop.error().code() == Code::kBusy);
  c2.close();
  wire::TensorListReq lr{"job", 0, 0};
  for (int i = 0; i < 200; ++i) {  // the daemon processes the close asynchronously
    auto l = c.call<wire::TensorListRep>(MsgType::kTensorList, lr);
    REQUIRE(l);
    if (l->tensors[0].readers == 0) break;
    usleep(5000);
  }
  REQUIRE(c.call<wire::Empty>(MsgType::kPoolDrop, wire::PoolNameReq{"job"}));
  CHECK(shm_objects_with_prefix(daemon::arena_prefix(d.state_dir())) == 0);
}

TEST_CASE("many clients at once") {
  TestDaemon d(opts());
  constexpr int kThreads = 8, kIters = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      auto c = RawClient::connect(d.socket());
      if (!c) {
        failures++;
        return;
      }
      std::string pool = "p" + std::to_string(i);
      if (!c->pool_create(pool, 32 << 20)) {
        failures++;
        return;
      }
      std::vector<uint64_t> ids;
      for (int k = 0; k < 4; ++k) {
        auto t = c->tensor_create(pool, "t" + std::to_string(k), 4096 * (k + 1));
        if (!t) {
          failures++;
          return;
        }
        ids.push_back(t->id);
      }
      for (int it = 0; it < kIters; ++it) {
        auto l = c->lease(it % 2 ? LeaseMode::kRead : LeaseMode::kWrite, ids);
        if (!l || l->grants.size() != ids.size()) {
          failures++;
          return;
        }
        std::vector<uint64_t> lids;
        for (auto& g : l->grants) lids.push_back(g.lease_id);
        if (!c->release(lids)) {
          failures++;
          return;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(failures == 0);
  RawClient c = must_connect(d);
  auto pools = c.call<wire::PoolListRep>(MsgType::kPoolList, wire::Empty{});
  REQUIRE(pools);
  CHECK(pools->pools.size() == kThreads);
}

TEST_CASE("lease conflicts across connections: fail fast, timeout, wait") {
  TestDaemon d(opts());
  RawClient a = must_connect(d), b = must_connect(d);
  REQUIRE(a.pool_create("job"));
  auto t = a.tensor_create("job", "w", 8192);
  REQUIRE(t);
  auto wl = a.lease(LeaseMode::kWrite, {t->id});
  REQUIRE(wl);

  auto busy = b.lease(LeaseMode::kRead, {t->id}, 0);
  REQUIRE(!busy);
  CHECK(busy.error().code() == Code::kBusy);
  auto late = b.lease(LeaseMode::kRead, {t->id}, 50);
  REQUIRE(!late);
  CHECK(late.error().code() == Code::kTimeout);

  // b waits without a deadline; a's release lets it through.
  wire::LeaseReq req{static_cast<uint8_t>(LeaseMode::kRead), -1, {t->id}};
  auto rid = b.send(MsgType::kLease, req);
  REQUIRE(rid);
  REQUIRE(!b.recv_raw(nullptr, 100));  // nothing yet: still waiting
  REQUIRE(a.release({wl->grants[0].lease_id}));
  auto granted = b.wait_reply<wire::LeaseRep>(MsgType::kLease, *rid);
  REQUIRE(granted);
  CHECK(granted->grants.size() == 1);

  // Readers share; a writer is refused while they hold.
  auto r2 = a.lease(LeaseMode::kRead, {t->id});
  REQUIRE(r2);
  auto w2 = a.lease(LeaseMode::kWrite, {t->id});
  REQUIRE(!w2);
  CHECK(w2.error().code() == Code::kBusy);
  // Batches are all or nothing.
  auto t2 = a.tensor_create("job", "w2", 8192);
  REQUIRE(t2);
  auto batch = a.lease(LeaseMode::kWrite, {t2->id, t->id});
  REQUIRE(!batch);
  auto free_w2 = b.lease(LeaseMode::kWrite, {t2->id});
  CHECK(free_w2);  // t2 was not left leased by the failed batch
  // Releasing someone else's lease is refused.
  CHECK(!a.release({granted->grants[0].lease_id}));
}

TEST_CASE("a client killed with leases held loses them") {
  TestDaemon d(opts());
  RawClient owner = must_connect(d);
  REQUIRE(owner.pool_create("job"));
  auto t = owner.tensor_create("job", "w", 4096);
  REQUIRE(t);
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto c = RawClient::connect(d.socket());
    bool ok = c && c->lease(LeaseMode::kWrite, {t->id});
    char b = ok ? 1 : 0;
    (void)!write(ready[1], &b, 1);
    pause();
    _exit(0);
  }
  char b = 0;
  REQUIRE(read(ready[0], &b, 1) == 1);
  REQUIRE(b == 1);
  auto busy = owner.lease(LeaseMode::kWrite, {t->id});
  REQUIRE(!busy);
  CHECK(busy.error().code() == Code::kBusy);
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  auto after = owner.lease(LeaseMode::kWrite, {t->id}, 5000);
  CHECK(after);
  close(ready[0]);
  close(ready[1]);
}

TEST_CASE("another uid is refused") {
  TestDaemon d(opts());
  // mkdtemp made the directory 0700; let uid 65534 reach the socket (mode 0666).
  REQUIRE(chmod(d.dir().c_str(), 0755) == 0);
  RawClient owner = must_connect(d);
  REQUIRE(owner.pool_create("rootjob"));
  auto t = owner.tensor_create("rootjob", "w", 4096);
  REQUIRE(t);
  auto l = owner.lease(LeaseMode::kRead, {t->id});
  REQUIRE(l);
  uint64_t arena = l->grants[0].arena_id;
  std::string shm;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (daemon::arena_name_matches(e.path().filename().string(), daemon::arena_prefix(d.state_dir()),
                                   daemon::arena_pool(arena), daemon::arena_node(arena)))
      shm = "/" + e.path().filename().string();
  REQUIRE(!shm.empty());

  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    auto c = RawClient::connect(d.socket());
    if (!c) _exit(11);
    auto open = c->call<wire::PoolInfoW>(MsgType::kPoolOpen, wire::PoolNameReq{"rootjob"});
    if (open || open.error().code() != Code::kPermissionDenied) _exit(12);
    if (open.error().message().find("belongs to uid 0") == std::string::npos) _exit(13);
    auto lease = c->lease(LeaseMode::kRead, {t->id});
    if (lease || lease.error().code() != Code::kPermissionDenied) _exit(14);
    int fd = -1;
    auto map = c->call<wire::MapArenaRep>(MsgType::kMapArena, wire::MapArenaReq{arena}, &fd);
    if (map || fd >= 0) _exit(15);
    auto drop = c->call<wire::Empty>(MsgType::kPoolDrop, wire::PoolNameReq{"rootjob"});
    if (drop || drop.error().code() != Code::kPermissionDenied) _exit(16);
    int sfd = shm_open(shm.c_str(), O_RDWR, 0);
    if (sfd >= 0 || errno != EACCES) _exit(17);
    auto list = c->call<wire::PoolListRep>(MsgType::kPoolList, wire::Empty{});
    if (!list || !list->pools.empty()) _exit(18);
    // Its own pool works.
    if (!c->pool_create("nobodyjob", 1 << 20)) _exit(19);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  // root may inspect and drop the other uid's pool.
  auto pools = owner.call<wire::PoolListRep>(MsgType::kPoolList, wire::Empty{});
  REQUIRE(pools);
  CHECK(pools->pools.size() == 2);
  CHECK(owner.call<wire::Empty>(MsgType::kPoolDrop, wire::PoolNameReq{"nobodyjob"}));
}

TEST_CASE("sd_notify: READY, STATUS and watchdog on a test NOTIFY_SOCKET; SIGTERM exits 0") {
  char tmpl[] = "/tmp/tierd-notify.XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  std::string path = std::string(tmpl) + "/notify";
  int ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  REQUIRE(bind(ns, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{0, 200000};
  setsockopt(ns, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

  DaemonOptions o = opts();
  o.env = {"NOTIFY_SOCKET=" + path, "WATCHDOG_USEC=200000", "JOURNAL_STREAM=8:12345"};
  std::string all, log;
  int exit_status = -1;
  {
    TestDaemon d(o);
    for (int i = 0; i < 25 && all.find("WATCHDOG=1") == std::string::npos; ++i) {
      char buf[4096];
      ssize_t n = recv(ns, buf, sizeof buf, 0);
      if (n > 0) all.append(buf, static_cast<size_t>(n)).append("\n");
    }
    exit_status = d.stop();
    log = d.log();
  }
  // Under journald every line carries its syslog priority.
  CHECK(log.find("<6>listening on ") != std::string::npos);
  CHECK(log.find("<6>stopped cleanly") != std::string::npos);
  CHECK(log.find("tierd: ") == std::string::npos);
  char buf[4096];
  ssize_t n = recv(ns, buf, sizeof buf, 0);
  if (n > 0) all.append(buf, static_cast<size_t>(n));
  CHECK(all.find("READY=1") != std::string::npos);
  CHECK(all.find("STATUS=RAM ") != std::string::npos);
  CHECK(all.find("WATCHDOG=1") != std::string::npos);
  CHECK(all.find("STOPPING=1") != std::string::npos);
  REQUIRE(WIFEXITED(exit_status));
  CHECK(WEXITSTATUS(exit_status) == 0);
  close(ns);
  std::filesystem::remove_all(tmpl);
}

TEST_CASE("garbage and oversized datagrams do not kill the daemon") {
  TestDaemon d(opts());
  auto send_bytes = [&](std::vector<std::byte> bytes, bool hello) {
    auto c = RawClient::connect(d.socket(), hello);
    REQUIRE(c);
    REQUIRE(c->send_raw(bytes));
    auto r = c->recv_raw(nullptr, 2000);
    // Either a kProtocol reply or a closed connection; never silence.
    if (r) {
      auto h = wire::parse_header(*r);
      REQUIRE(h);
      auto body = wire::decode_reply<wire::Empty>(wire::payload_of(*r));
      REQUIRE(!body);
      CHECK(body.error().code() == Code::kProtocol);
    } else {
      CHECK(r.error().code() == Code::kUnavailable);
    }
  };
  send_bytes({std::byte{1}, std::byte{2}, std::byte{3}}, false);
  send_bytes(std::vector<std::byte>(16, std::byte{0xff}), true);
  // Another protocol version: a kProtocol reply naming it, then the connection closes.
  {
    std::vector<std::byte> v2;
    REQUIRE(wire::encode(static_cast<uint16_t>(MsgType::kHello), 1, wire::HelloReq{}, v2));
    const uint16_t other = wire::kVersion + 1;
    std::memcpy(v2.data() + 4, &other, sizeof other);  // Header.version (little-endian)
    auto c = RawClient::connect(d.socket(), false);
    REQUIRE(c);
    REQUIRE(c->send_raw(v2));
    auto r = c->recv_raw(nullptr, 2000);
    REQUIRE(r);
    auto body = wire::decode_reply<wire::HelloRep>(wire::payload_of(*r));
    REQUIRE(!body);
    CHECK(body.error().message().find("version " + std::to_string(other)) != std::string::npos);
    auto closed = c->recv_raw(nullptr, 2000);
    REQUIRE(!closed);
    CHECK(closed.error().code() == Code::kUnavailable);
  }
  send_bytes(std::vector<std::byte>(70000, std::byte{0x54}), true);
  // A valid header with a body that does not decode.
  std::vector<std::byte> bad;
  REQUIRE(wire::encode(static_cast<uint16_t>(MsgType::kLease), 7, wire::Empty{}, bad));
  send_bytes(bad, true);
  // Requests before Hello.
  std::vector<std::byte> status;
  REQUIRE(wire::encode(static_cast<uint16_t>(MsgType::kStatus), 1, wire::Empty{}, status));
  send_bytes(status, false);
  // Random junk of random lengths.
  uint32_t seed = 12345;
  for (int i = 0; i < 50; ++i) {
    std::vector<std::byte> junk(16 + (seed % 300));
    for (auto& b : junk) {
      seed = seed * 1103515245 + 12345;
      b = std::byte(seed >> 16);
    }
    if (i % 2) std::memcpy(junk.data(), &wire::kMagic, 4);
    auto c = RawClient::connect(d.socket(), true);
    REQUIRE(c);
    REQUIRE(c->send_raw(junk));
    (void)c->recv_raw(nullptr, 2000);
  }
  RawClient c = must_connect(d);
  CHECK(c.call<wire::StatusRep>(MsgType::kStatus, wire::Empty{}));
  REQUIRE(d.running());
}

TEST_CASE("NUMA placement on the 2-node XML topology; the node-0 arena is bound") {
  TestDaemon d(opts({"--topology-xml", std::string(TIER_SOURCE_DIR) + "/tests/data/topo-2numa-4gpu.xml"}));
  RawClient c = must_connect(d, /*node=*/1);
  auto topo = c.call<wire::TopoRep>(MsgType::kTopo, wire::Empty{});
  REQUIRE(topo);
  REQUIRE(topo->nodes.size() == 2);
  REQUIRE(topo->gpus.size() == 4);
  REQUIRE(c.pool_create("job", 64 << 20));
  auto g0 = c.tensor_create("job", "g0", 1 << 20, 2, 0);
  auto g3 = c.tensor_create("job", "g3", 1 << 20, 2, 3);
  auto n0 = c.tensor_create("job", "n0", 4 << 20, 1, 0);
  auto any = c.tensor_create("job", "any", 1 << 20);
  REQUIRE(g0);
  REQUIRE(g3);
  REQUIRE(n0);
  REQUIRE(any);
  CHECK(g0->numa_node == topo->gpus[0].numa_node);
  CHECK(g0->numa_node == 0);
  CHECK(g3->numa_node == 1);
  CHECK(n0->numa_node == 0);
  CHECK(any->numa_node == 1);  // the client said it runs on node 1
  auto bad = c.tensor_create("job", "bad", 4096, 2, 9);
  REQUIRE(!bad);
  CHECK(bad.error().code() == Code::kInvalidArgument);

  // Node 0 exists in this kernel: its arena is MPOL_BIND to node 0 and its pages land there.
  auto l = c.lease(LeaseMode::kWrite, {n0->id});
  REQUIRE(l);
  int fd = -1;
  auto map = c.call<wire::MapArenaRep>(MsgType::kMapArena, wire::MapArenaReq{l->grants[0].arena_id}, &fd);
  REQUIRE(map);
  CHECK(map->numa_node == 0);
  auto* base = static_cast<char*>(mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(base != MAP_FAILED);
  char* p = base + l->grants[0].offset;
  int mode = -1;
  unsigned long mask[16] = {};
  REQUIRE(get_mempolicy(&mode, mask, sizeof(mask) * 8, p, MPOL_F_ADDR) == 0);
  CHECK(mode == MPOL_BIND);
  CHECK((mask[0] & 1u) == 1u);
  std::memset(p, 1, 4 << 20);
  constexpr int kPages = 8;
  void* pages[kPages];
  int status[kPages];
  for (int i = 0; i < kPages; ++i) pages[i] = p + i * 4096 * 64;
  REQUIRE(move_pages(0, kPages, pages, nullptr, status, 0) == 0);
  for (int i = 0; i < kPages; ++i) CHECK(status[i] == 0);
  munmap(base, map->size);
  close(fd);
}

TEST_CASE(
    "clean exit keeps /dev/shm clean with --remove-arenas-on-exit; --cleanup-arenas removes leftovers") {
  std::string prefix;
  {
    TestDaemon d(opts());
    prefix = daemon::arena_prefix(d.state_dir());
    RawClient c = must_connect(d);
    REQUIRE(c.pool_create("job", 8 << 20));
    REQUIRE(c.tensor_create("job", "w", 4096));
    CHECK(shm_objects_with_prefix(prefix) == 1);
    int st = d.stop();
    REQUIRE(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK(shm_objects_with_prefix(prefix) == 0);
  }
  {
    TestDaemon d(DaemonOptions{});  // production behaviour: arenas outlive the daemon
    prefix = daemon::arena_prefix(d.state_dir());
    RawClient c = must_connect(d);
    REQUIRE(c.pool_create("job", 8 << 20));
    REQUIRE(c.tensor_create("job", "w", 4096));
    d.kill9();
    CHECK(shm_objects_with_prefix(prefix) == 1);
    // A new daemon on the same state dir re-attaches the arena its journal names (the pool and
    // its tensor are back; nothing is replaced).
    d.start();
    {
      RawClient c2 = must_connect(d);
      auto p = c2.pool_create("job", 8 << 20);
      REQUIRE_FALSE(p);
      CHECK(p.error().code() == Code::kAlreadyExists);
      auto t = c2.tensor_create("job", "w2", 4096);
      REQUIRE(t);
      CHECK(t->tiers == kTierRam);
      CHECK(shm_objects_with_prefix(prefix) == 1);
    }
    CHECK(d.log().find("1 arenas re-attached") != std::string::npos);
    CHECK(d.log().find("replacing stale arena") == std::string::npos);
    d.kill9();
    std::string cmd = bin_path("tierd") + " --state-dir " + d.state_dir() + " --cleanup-arenas >/dev/null";
    CHECK(std::system(cmd.c_str()) == 0);
    CHECK(shm_objects_with_prefix(prefix) == 0);
  }
}

TEST_CASE("command line: --check-config and exit codes") {
  char tmpl[] = "/tmp/tierd-cli.XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  std::string dir = tmpl;
  auto run = [&](const std::string& args) {
    std::string cmd = bin_path("tierd") + " " + args + " >" + dir + "/out 2>&1";
    int st = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(st));
    return WEXITSTATUS(st);
  };
  auto out = [&] {
    std::ifstream f(dir + "/out");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  std::string base = "--state-dir " + dir + "/state --socket " + dir + "/s ";
  CHECK(run(base + "--ram 1G --check-config") == 0);
  CHECK(out().find("configuration ok") != std::string::npos);
  CHECK(run(base + "--ram 1G --topology-synthetic 'pack:2 numa:1 core:1 pu:1' --check-config") == 0);
  CHECK(out().find("2 NUMA nodes") != std::string::npos);
  CHECK(run(base + "--ram lots --check-config") == 2);
  CHECK(out().find("invalid size 'lots'") != std::string::npos);
  CHECK(run(base + "--no-such-flag") == 2);
  CHECK(run(base + "--nvme-dir /nonexistent/dir --check-config") == 2);
  CHECK(out().find("/nonexistent/dir") != std::string::npos);
  CHECK(run(base + "--hugepages 3M --check-config") == 2);
  if (daemon::free_hugepages(daemon::HugePages::k2M) == 0) {
    CHECK(run(base + "--ram 64M --hugepages 2M --check-config") == 2);
    CHECK(out().find("no 2M huge pages are reserved") != std::string::npos);
    CHECK(run(base + "--ram 64M --hugepages 2M") == 2);  // the daemon itself refuses to start
    CHECK(out().find("nr_hugepages") != std::string::npos);
  } else {
    WARN("2M huge pages are reserved on this machine: the no-huge-pages error is not tested");
  }
  {
    std::ofstream cfg(dir + "/bad.toml");
    cfg << "ram = \"1G\"\nsokcet = \"/x\"\n";
  }
  CHECK(run(base + "--config " + dir + "/bad.toml --check-config") == 2);
  CHECK(out().find("unknown config key 'sokcet'") != std::string::npos);
  CHECK(run("--config " + std::string(TIER_SOURCE_DIR) + "/daemon/tierd.toml.example " + base +
            "--check-config") == 0);
  // The socket is in use by a live daemon: a second one refuses to start (runtime error).
  {
    TestDaemon d(opts());
    CHECK(run("--state-dir " + dir + "/state --socket " + d.socket() + " --ram 64M") == 1);
    CHECK(out().find("another tierd is serving") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("running out of file descriptors refuses clients but keeps serving") {
  TestDaemon d(opts());
  rlimit lim{32, 32};
  REQUIRE(prlimit(d.pid(), RLIMIT_NOFILE, &lim, nullptr) == 0);
  std::vector<RawClient> clients;
  int refused = 0;
  for (int i = 0; i < 60; ++i) {
    auto c = RawClient::connect(d.socket(), true);
    if (c) clients.push_back(std::move(*c));
    else ++refused;
  }
  CHECK(refused > 0);
  CHECK(clients.size() > 5);  // each takes two of tierd's fds: its socket and its process's pidfd
  // The connected ones still work.
  CHECK(clients.front().call<wire::StatusRep>(MsgType::kStatus, wire::Empty{}));
  clients.clear();
  bool ok = false;
  for (int i = 0; i < 200 && !ok; ++i) {  // the daemon sees the closes asynchronously
    auto c = RawClient::connect(d.socket(), true);
    ok = c && c->call<wire::StatusRep>(MsgType::kStatus, wire::Empty{}).has_value();
    if (!ok) usleep(10000);
  }
  CHECK(ok);
  CHECK(d.log().find("out of file descriptors") != std::string::npos);
}

// nvme_hash_threads reaches the NVMe engine: the daemon runs that many more threads (its
// HashPool's) with 6 than with 0, everything else alike.
TEST_CASE("config: nvme_hash_threads sets the NVMe tier's checksum workers") {
  auto threads_with = [](int hash_threads) {
    char tmpl[] = "/tmp/tierd-hash.XXXXXX";
    REQUIRE(mkdtemp(tmpl));
    const std::string dir = tmpl;
    {
      std::ofstream cfg(dir + "/c.toml");
      cfg << "nvme_capacity = \"64M\"\nnvme_hash_threads = " << hash_threads << "\n";
    }
    std::filesystem::create_directory(dir + "/nvme");
    int n = -1;
    {
      TestDaemon d(opts({"--config", dir + "/c.toml", "--nvme-dir", dir + "/nvme"}));
      REQUIRE(d.running());
      n = 0;
      for ([[maybe_unused]] const auto& e :
           std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid()) + "/task"))
        ++n;
    }
    std::filesystem::remove_all(dir);
    return n;
  };
  const int none = threads_with(0), six = threads_with(6);
  INFO("threads with 0 hash threads: " << none << ", with 6: " << six);
  CHECK(six - none == 6);
}
