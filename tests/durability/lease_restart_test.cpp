// Write leases across a real kill -9 of tierd (docs/daemon.md, "Leases across a restart").
//
// A writer W (a forked process with its own connection) holds a write lease on an 8 MiB tensor
// and keeps storing a recognizable pattern into its mapping while tierd is killed -9 (or stopped) and
// restarted on the same socket and state dir. Right after the restart a second client F (same
// uid and pool) creates and writes more 8 MiB tensors than the 64 MiB RAM tier holds, so every
// extent is reused unless the daemon keeps W's reserved. Then: none of F's acknowledged tensors
// holds a byte of W's; W's release either succeeds and its tensor holds exactly W's last round,
// or reports the lease lost; later reads (from NVMe, checksums verified) all succeed.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"
#include "tier/client.hpp"

using namespace tier;
using tier::test::DaemonOptions;
using tier::test::TestDaemon;

namespace {

constexpr size_t kSize = 8 << 20;
constexpr uint64_t kWTag = 0x5757575700000000ull;  // W's words: this tag | round
constexpr uint64_t kTagMask = 0xffffffff00000000ull;

std::unique_ptr<Client> connect_to(const TestDaemon& d) {
  auto c = Client::connect(d.socket(), {.client_name = "lease-restart-test",
                                        .connect_timeout = std::chrono::seconds(5),
                                        .reconnect_timeout = std::chrono::milliseconds(10000)});
  REQUIRE(c.has_value());
  return std::move(*c);
}

// F's contents: words from a generator seeded by the name, never carrying W's tag.
void fill_f(std::span<std::byte> b, const std::string& name) {
  std::mt19937_64 rng(std::hash<std::string>{}(name));
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t x = rng();
    if ((x & kTagMask) == kWTag) x ^= 1ull << 63;
    std::memcpy(b.data() + i, &x, 8);
  }
}

struct Scan {
  size_t mismatched = 0;  // words that differ from what was expected
  size_t w_words = 0;     // words carrying W's tag
};

Scan scan_f(std::span<const std::byte> b, const std::string& name) {
  std::vector<std::byte> want(b.size());
  fill_f(want, name);
  Scan s;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t got;
    std::memcpy(&got, b.data() + i, 8);
    if (std::memcmp(b.data() + i, want.data() + i, 8) != 0) s.mismatched++;
    if ((got & kTagMask) == kWTag) s.w_words++;
  }
  return s;
}

void fill_w(std::span<std::byte> b, uint64_t round) {
  const uint64_t w = kWTag | round;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) std::memcpy(b.data() + i, &w, 8);
}

// Words of `b` that do not carry W's tag.
size_t not_w(std::span<const std::byte> b) {
  size_t n = 0;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t x;
    std::memcpy(&x, b.data() + i, 8);
    n += (x & kTagMask) != kWTag;
  }
  return n;
}

// Words of `b` that are not W's round `round`.
size_t not_round(std::span<const std::byte> b, uint64_t round) {
  const uint64_t w = kWTag | round;
  size_t n = 0;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) n += std::memcmp(b.data() + i, &w, 8) != 0;
  return n;
}

// What W reports when it is done.
struct WReport {
  int code = -1;  // the Code its release returned
  uint64_t last_round = 0;
  char message[200] = {};
};

bool read_full(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The writer: takes a write lease on `tensor`, writes round 1, says so on `ready`, then
//   idle_ms == 0: writes round after round through its mapping until a byte arrives on `stop`,
//                 then one last full round, and releases;
//   idle_ms > 0:  writes nothing more; once a byte arrives on `stop` it stays silent for
//                 idle_ms (a holder that does not call tierd), then releases.
// Reports its release on `report`.
[[noreturn]] void writer(const std::string& socket, uint64_t tensor, int ready, int stop, int report,
                         int idle_ms) {
  auto c = Client::connect(socket, {.client_name = "writer",
                                    .connect_timeout = std::chrono::seconds(5),
                                    .reconnect_timeout = std::chrono::milliseconds(10000)});
  if (!c) _exit(10);
  auto l = (*c)->lease(tensor, LeaseMode::kWrite, {.timeout_ms = 5000});
  if (!l) _exit(11);
  uint64_t round = 1;
  fill_w(l->bytes(), round);
  const uint64_t id = l->id();  // the lease id this daemon granted
  if (::write(ready, &id, sizeof id) != sizeof id) _exit(12);
  if (idle_ms > 0) {
    pollfd p{stop, POLLIN, 0};
    (void)::poll(&p, 1, -1);
    std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
  } else {
    for (;;) {
      pollfd p{stop, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) break;
      fill_w(l->bytes(), ++round);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    fill_w(l->bytes(), ++round);
  }
  Status st = l->release();
  WReport r;
  r.code = static_cast<int>(st.code());
  r.last_round = round;
  std::strncpy(r.message, st.message().c_str(), sizeof r.message - 1);
  _exit(::write(report, &r, sizeof r) == sizeof r ? 0 : 13);
}

struct Writer {
  pid_t pid = -1;
  uint64_t lease_id = 0;  // as the first daemon granted it
  int stop = -1, report = -1;
  void finish() {
    char one = 1;
    REQUIRE(::write(stop, &one, 1) == 1);
  }
  WReport result() {
    WReport r;
    REQUIRE(read_full(report, &r, sizeof r));
    int ws = 0;
    REQUIRE(::waitpid(pid, &ws, 0) == pid);
    CHECK(WIFEXITED(ws));
    CHECK(WEXITSTATUS(ws) == 0);
    pid = -1;
    return r;
  }
  ~Writer() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (int fd : {stop, report})
      if (fd >= 0) ::close(fd);
  }
};

void start_writer(Writer& w, const TestDaemon& d, uint64_t tensor, int idle_ms = 0) {
  int ready[2], stop[2], report[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(stop) == 0);
  REQUIRE(::pipe(report) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    ::close(stop[1]);
    ::close(report[0]);
    writer(d.socket(), tensor, ready[1], stop[0], report[1], idle_ms);
  }
  ::close(ready[1]);
  ::close(stop[0]);
  ::close(report[1]);
  w.pid = pid;
  w.stop = stop[1];
  w.report = report[0];
  REQUIRE(read_full(ready[0], &w.lease_id, sizeof w.lease_id));  // W holds the lease and writes
  ::close(ready[0]);
}

struct NvmeDir {
  std::string path =
      std::filesystem::temp_directory_path().string() + "/tierd-lease-restart-" + std::to_string(::getpid());
  NvmeDir() { std::filesystem::create_directories(path); }
  ~NvmeDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

uint64_t create(Client& c, const std::string& name) {
  TensorDesc desc;
  desc.name = name;
  desc.size = kSize;
  auto t = c.create_tensor("p", desc);
  REQUIRE(t.has_value());
  return t->id;
}

// A tierd with a 64 MiB RAM tier, an NVMe directory and `config`, pool "p" and W's tensor "w".
struct Node {
  NvmeDir nvme;
  TestDaemon d;
  uint64_t wid = 0;
  explicit Node(const std::string& config = "") : d(options(nvme, config)) {
    auto c = connect_to(d);
    REQUIRE(c->create_pool("p", {}).has_value());
    wid = create(*c, "w");
  }
  static DaemonOptions options(const NvmeDir& nvme, const std::string& config) {
    DaemonOptions o;
    o.ram = "64M";
    o.extra_args = {"--nvme-dir", nvme.path};
    if (!config.empty()) {
      std::string path = nvme.path + "/tierd.toml";
      std::ofstream(path) << config;
      o.extra_args.insert(o.extra_args.end(), {"--config", path});
    }
    return o;
  }
};

}  // namespace

TEST_CASE(
    "a write lease held across kill -9 or a stop of tierd is kept for its holder: no other client's "
    "tensor gets its bytes") {
  Node node;
  TestDaemon& d = node.d;
  const uint64_t wid = node.wid;
  Writer w;
  start_writer(w, d, wid);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  SECTION("kill -9") { d.kill9(); }
  SECTION("SIGTERM") { d.stop(); }  // a clean stop keeps the lease journaled as held too
  d.start();

  // F, right after the restart: 16 tensors of 8 MiB through a 64 MiB RAM tier.
  auto f = connect_to(d);
  std::vector<std::string> names;
  for (int i = 0; i < 16; ++i) {
    std::string name = "f" + std::to_string(i);
    uint64_t id = create(*f, name);
    auto l = f->lease(id, LeaseMode::kWrite, {.timeout_ms = 10000});
    REQUIRE(l.has_value());
    fill_f(l->bytes(), name);
    REQUIRE(l->release().is_ok());
    names.push_back(name);
  }
  // While W still writes: every acknowledged tensor of F's holds F's bytes, none of W's.
  auto check_f = [&](const char* when) {
    for (const std::string& name : names) {
      INFO(when << ": tensor " << name);
      auto t = f->open_tensor("p", name);
      REQUIRE(t.has_value());
      auto l = f->lease(t->id, LeaseMode::kRead, {.timeout_ms = 10000});
      if (!l) FAIL_CHECK(l.error().to_string() << "\n" << d.log());
      if (!l) continue;
      Scan s = scan_f(l->bytes(), name);
      CHECK(s.w_words == 0);
      CHECK(s.mismatched == 0);
    }
  };
  check_f("while W writes");
  // W's tensor is nobody else's meanwhile, and only W can take its lease back: not another
  // process of the same uid naming W's lease id, not a wrong id.
  auto busy = f->lease(wid, LeaseMode::kRead);
  REQUIRE_FALSE(busy.has_value());
  CHECK(busy.error().code() == Code::kBusy);
  auto raw = tier::test::RawClient::connect(d.socket());
  REQUIRE(raw.has_value());
  auto steal =
      raw->call<wire::LeaseRep>(wire::MsgType::kLeaseReclaim, wire::LeaseReclaimReq{wid, w.lease_id});
  REQUIRE_FALSE(steal.has_value());
  CHECK(steal.error().code() == Code::kPermissionDenied);
  auto wrong =
      raw->call<wire::LeaseRep>(wire::MsgType::kLeaseReclaim, wire::LeaseReclaimReq{wid, w.lease_id + 1});
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code() == Code::kNotFound);

  w.finish();
  WReport r = w.result();
  INFO("W's release: code " << r.code << " " << r.message);
  if (r.code == static_cast<int>(Code::kOk)) {
    auto l = f->lease(wid, LeaseMode::kRead, {.timeout_ms = 10000});
    REQUIRE(l.has_value());
    CHECK(not_round(l->bytes(), r.last_round) == 0);  // exactly W's last round
  } else {
    CHECK(r.code == static_cast<int>(Code::kUnavailable));
    CHECK(std::string(r.message).find("lost") != std::string::npos);
  }
  CHECK(r.code == static_cast<int>(Code::kOk));  // W reconnected in time: it got its lease back

  // Everything through NVMe: each read verifies the extent checksums.
  REQUIRE(f->evict("p").is_ok());
  check_f("after eviction");
  auto l = f->lease(wid, LeaseMode::kRead, {.timeout_ms = 10000});
  REQUIRE(l.has_value());
  CHECK(not_round(l->bytes(), r.last_round) == 0);
  (void)l->release();
  auto st = f->status();
  REQUIRE(st.has_value());
  CHECK(st->leases == 0);
  CHECK(d.log().find("checksum") == std::string::npos);
}

TEST_CASE(
    "a write lease from before a restart is lost after the reclaim timeout, or at once when "
    "its holder is gone, and the tensor keeps the bytes it left") {
  Node node("lease_reclaim_timeout_ms = 2000\n");
  TestDaemon& d = node.d;
  const uint64_t wid = node.wid;
  Writer w;
  SECTION("a silent holder loses it after the timeout") {
    start_writer(w, d, wid, /*idle_ms=*/3000);
    d.kill9();
    d.start();
    w.finish();  // W now stays silent for 3 s, past the 2 s timeout, then releases
    auto f = connect_to(d);
    // Reserved for W until the timeout, then anyone's again.
    auto busy = f->lease(wid, LeaseMode::kWrite);
    REQUIRE_FALSE(busy.has_value());
    CHECK(busy.error().code() == Code::kBusy);
    auto later = f->lease(wid, LeaseMode::kRead, {.timeout_ms = 10000});
    REQUIRE(later.has_value());
    CHECK(not_round(later->bytes(), 1) == 0);  // the bytes W left, kept (dirty)
    (void)later->release();
    WReport r = w.result();
    INFO("W's release: " << r.message);
    CHECK(r.code == static_cast<int>(Code::kUnavailable));
    CHECK(std::string(r.message).find("lost") != std::string::npos);
    CHECK(std::string(r.message).find("lease_reclaim_timeout_ms") != std::string::npos);
    REQUIRE(f->evict("p").is_ok());  // it was dirty: written back, then read back from NVMe
    auto again = f->lease(wid, LeaseMode::kRead, {.timeout_ms = 10000});
    REQUIRE(again.has_value());
    CHECK(not_round(again->bytes(), 1) == 0);
  }
  SECTION("a holder that died with tierd frees it at once") {
    start_writer(w, d, wid);
    d.kill9();
    ::kill(w.pid, SIGKILL);  // W dies mid-round, holding the lease
    ::waitpid(w.pid, nullptr, 0);
    w.pid = -1;
    d.start();
    auto f = connect_to(d);
    auto l = f->lease(wid, LeaseMode::kWrite);  // no wait: nothing holds it any more
    REQUIRE(l.has_value());
    CHECK(not_w(l->bytes()) == 0);  // what W left
  }
}
