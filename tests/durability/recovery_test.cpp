// tierd durability end to end: kill -9 of the daemon at random points of a put / evict /
// prefetch / snapshot / delete workload, kill -9 of lease-holding clients, a simulated reboot
// after a snapshot, damaged journals, and a client that lives through a daemon restart.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

using namespace tier;
using tier::test::DaemonOptions;
using tier::test::TestDaemon;

namespace {

std::unique_ptr<Client> connect_to(const TestDaemon& d, int reconnect_ms = 0) {
  auto c = Client::connect(d.socket(), {.client_name = "durability-test",
                                        .connect_timeout = std::chrono::seconds(5),
                                        .reconnect_timeout = std::chrono::milliseconds(reconnect_ms)});
  REQUIRE(c.has_value());
  return std::move(*c);
}

// Deterministic tensor contents: name -> bytes.
std::vector<std::byte> content(const std::string& name, size_t size) {
  std::vector<std::byte> v(size);
  std::mt19937_64 rng(std::hash<std::string>{}(name));
  for (size_t i = 0; i < size; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, size - i));
  }
  return v;
}

uint64_t hash_of(std::span<const std::byte> b) { return XXH3_64bits(b.data(), b.size()); }

// Creates `name` and writes its content under a write lease; true once both are acknowledged.
bool put(Client& c, const std::string& pool, const std::string& name, size_t size) {
  TensorDesc d;
  d.name = name;
  d.size = size;
  auto t = c.create_tensor(pool, d);
  if (!t) return false;
  auto l = c.lease(t->id, LeaseMode::kWrite);
  if (!l) return false;
  auto bytes = content(name, size);
  std::memcpy(l->bytes().data(), bytes.data(), size);
  return l->release().is_ok();
}

// Reads `name` back; its hash, or nullopt when it is missing or unreadable.
std::optional<uint64_t> read_hash(Client& c, const std::string& pool, const std::string& name) {
  auto t = c.open_tensor(pool, name);
  if (!t) {
    WARN("open " << name << ": " << t.error().message());
    return std::nullopt;
  }
  auto l = c.lease(t->id, LeaseMode::kRead, {.timeout_ms = 10000});
  if (!l) {
    WARN("lease " << name << ": " << l.error().message());
    return std::nullopt;
  }
  return hash_of(l->bytes());
}

std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[512];
  while (f && std::fgets(buf, sizeof buf, f)) out += buf;
  int st = f ? ::pclose(f) : -1;
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string journal_path(const TestDaemon& d) { return d.state_dir() + "/journal/catalog.journal"; }

}  // namespace

TEST_CASE(
    "kill -9 of tierd at random points of put/evict/prefetch/snapshot/delete loops loses no acknowledged "
    "tensor") {
  std::string nvme =
      std::filesystem::temp_directory_path().string() + "/tierd-dur-nvme-" + std::to_string(::getpid());
  std::filesystem::create_directories(nvme);
  DaemonOptions dopt;
  dopt.ram = "128M";
  dopt.extra_args = {"--nvme-dir", nvme};
  TestDaemon d(dopt);
  // tools/soak varies these: TIER_SOAK_SEED (kill timing and workload), TIER_SOAK_TRIALS.
  const char* seed_env = std::getenv("TIER_SOAK_SEED");
  const char* trials_env = std::getenv("TIER_SOAK_TRIALS");
  const unsigned seed = seed_env ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10)) : 12345u;
  const int kTrials = trials_env ? std::atoi(trials_env) : 24;
  constexpr size_t kSize = 48 << 10;
  std::map<std::string, uint64_t> acked;  // name -> hash of what was acknowledged
  std::mt19937 rng(seed);
  uint64_t total_ops = 0, checked = 0, unknown = 0;
  std::set<std::string> maybe;  // a delete was in flight when tierd died: either answer is right
  int seq = 0;
  {
    auto c = connect_to(d);
    REQUIRE(c->create_pool("kill", {.ram_quota = 64 << 20}).has_value());
  }
  for (int trial = 0; trial < kTrials; ++trial) {
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::thread worker([&] {
      auto cr = Client::connect(d.socket(),
                                {.client_name = "worker", .reconnect_timeout = std::chrono::milliseconds(0)});
      if (!cr) return;
      Client& c = **cr;
      std::mt19937 wr(seed + static_cast<unsigned>(trial * 7919));
      while (!stop.load()) {
        int op = static_cast<int>(wr() % 10);
        std::string name;
        {
          std::lock_guard g(mu);
          name = "t" + std::to_string(seq++);
          total_ops++;
        }
        if (op < 6) {
          if (!put(c, "kill", name, kSize)) return;
          std::lock_guard g(mu);
          acked[name] = hash_of(content(name, kSize));
        } else if (op == 6) {
          if (!c.evict("kill").is_ok()) return;
        } else if (op == 7) {
          std::vector<uint64_t> ids;
          auto ts = c.list_tensors("kill");
          if (!ts) return;
          for (size_t i = 0; i < ts->size() && i < 8; ++i) ids.push_back((*ts)[i].id);
          if (!c.prefetch("kill", ids).is_ok()) return;
        } else if (op == 8) {
          auto s = c.snapshot("kill");
          if (!s && s.error().code() != Code::kBusy) return;
        } else {
          std::string victim;
          {
            std::lock_guard g(mu);
            if (acked.size() < 4) continue;
            auto it = acked.begin();
            std::advance(it, static_cast<long>(wr() % acked.size()));
            victim = it->first;
            acked.erase(it);
            maybe.insert(victim);
          }
          if (!c.delete_tensor("kill", victim).is_ok()) return;
          std::lock_guard g(mu);
          maybe.erase(victim);
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 120));
    d.kill9();
    stop = true;
    worker.join();
    d.start();
    auto c = connect_to(d);
    for (const auto& [name, h] : acked) {
      auto got = read_hash(*c, "kill", name);
      INFO("trial " << trial << " tensor " << name);
      if (!got) WARN(d.log());
      REQUIRE(got.has_value());
      CHECK(*got == h);
      ++checked;
    }
    unknown += maybe.size();
    maybe.clear();
    // Bound the pool so the trials stay quick: delete what was verified beyond 200 tensors.
    while (acked.size() > 200) {
      auto it = acked.begin();
      REQUIRE(c->delete_tensor("kill", it->first).is_ok());
      acked.erase(it);
    }
  }
  auto c = connect_to(d);
  auto st = c->status();
  REQUIRE(st.has_value());
  CHECK(st->leases == 0);
  std::printf(
      "kill -9 trials: %d, operations %llu, acknowledged tensors verified %llu (all matched their hash), "
      "deletes in flight at a kill %llu\n",
      kTrials, static_cast<unsigned long long>(total_ops), static_cast<unsigned long long>(checked),
      static_cast<unsigned long long>(unknown));
  std::error_code ec;
  std::filesystem::remove_all(nvme, ec);
}

TEST_CASE("kill -9 of clients holding read and write leases leaks no lease and loses no byte") {
  TestDaemon d;
  auto c = connect_to(d);
  REQUIRE(c->create_pool("lk", {.ram_quota = 16 << 20}).has_value());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    std::string n = "w" + std::to_string(i);
    REQUIRE(put(*c, "lk", n, 8192));
    ids.push_back(c->open_tensor("lk", n)->id);
  }
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k) {
    int pfd[2];
    REQUIRE(::pipe(pfd) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(pfd[0]);
      auto cc = Client::connect(d.socket());
      if (!cc) _exit(1);
      // Child k: read leases on every tensor but k's, a write lease on tensor k (rewriting the
      // same bytes), then it waits to be killed.
      std::vector<Lease> held;
      for (int i = 0; i < 6; ++i) {
        if (i == k) continue;
        auto l = (*cc)->lease(ids[i], LeaseMode::kRead, {.timeout_ms = 5000});
        if (!l) _exit(2);
        held.push_back(std::move(*l));
      }
      auto w = (*cc)->lease(ids[k], LeaseMode::kWrite, {.timeout_ms = 5000});
      if (!w) _exit(3);
      auto bytes = content("w" + std::to_string(k), 8192);
      std::memcpy(w->bytes().data(), bytes.data(), bytes.size());
      char ok = 1;
      (void)!::write(pfd[1], &ok, 1);
      for (;;) ::pause();
    }
    ::close(pfd[1]);
    char ok = 0;
    REQUIRE(::read(pfd[0], &ok, 1) == 1);
    ::close(pfd[0]);
    kids.push_back(pid);
    // Kill before the next child, since the next child wants a read lease on this one's tensor.
    ::kill(pid, SIGKILL);
    int ws;
    ::waitpid(pid, &ws, 0);
  }
  uint64_t leases = 1;
  for (int i = 0; i < 200 && leases != 0; ++i) {
    auto st = c->status();
    REQUIRE(st.has_value());
    leases = st->leases;
    if (leases) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(leases == 0);
  for (int i = 0; i < 6; ++i) {
    auto w = c->lease(ids[i], LeaseMode::kWrite);  // no leaked reader or writer blocks it
    REQUIRE(w.has_value());
    CHECK(hash_of(w->bytes()) == hash_of(content("w" + std::to_string(i), 8192)));
  }
}

TEST_CASE("a simulated reboot after a snapshot brings every tensor of the snapshot back bit-exact") {
  TestDaemon d;
  std::vector<std::string> names;
  {
    auto c = connect_to(d);
    REQUIRE(c->create_pool("snap", {.ram_quota = 32 << 20}).has_value());
    for (int i = 0; i < 40; ++i) {
      names.push_back("s" + std::to_string(i));
      REQUIRE(put(*c, "snap", names.back(), 4096 + 1024 * static_cast<size_t>(i)));
    }
    auto s = c->snapshot("snap");
    REQUIRE(s.has_value());
    CHECK(s->bytes > 0);
    std::printf("snapshot of 40 tensors (%llu bytes): stall %llu us\n",
                static_cast<unsigned long long>(s->bytes), static_cast<unsigned long long>(s->stall_us));
    // A second snapshot replaces the first (only the latest is kept).
    auto s2 = c->snapshot("snap");
    REQUIRE(s2.has_value());
    CHECK(s2->snapshot_id > s->snapshot_id);
    // After the snapshot: a new tensor (lost in a reboot) and a rewrite (reverted).
    REQUIRE(put(*c, "snap", "after", 4096));
    auto t0 = c->open_tensor("snap", "s0");
    auto w = c->lease(t0->id, LeaseMode::kWrite);
    REQUIRE(w.has_value());
    std::memset(w->bytes().data(), 0xAB, 100);
  }
  size_t snaps = 0;
  for (auto& e : std::filesystem::directory_iterator(d.state_dir() + "/snapshots/snap")) (void)e, ++snaps;
  CHECK(snaps == 1);
  d.kill9();
  // The reboot: shared memory is gone.
  int rc = 0;
  run_capture(tier::test::bin_path("tierd") + " --state-dir " + d.state_dir() + " --cleanup-arenas", &rc);
  REQUIRE(rc == 0);
  d.start();
  auto c = connect_to(d);
  for (size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    auto h = read_hash(*c, "snap", names[i]);
    REQUIRE(h.has_value());
    CHECK(*h == hash_of(content(names[i], 4096 + 1024 * i)));
  }
  CHECK_FALSE(c->open_tensor("snap", "after").has_value());
  CHECK(d.log().find("1 tensors lost in the reboot") != std::string::npos);
}

TEST_CASE("a truncated journal recovers its valid records, a corrupted one is refused with a clear message") {
  TestDaemon d;
  {
    auto c = connect_to(d);
    REQUIRE(c->create_pool("j", {.ram_quota = 8 << 20}).has_value());
    for (int i = 0; i < 9; ++i) REQUIRE(put(*c, "j", "x" + std::to_string(i), 4096));
    // Created only (no write lease, whose records would follow): its create is the last record.
    REQUIRE(c->create_tensor("j", TensorDesc{.name = "x9", .size = 4096, .shape = {}, .placement = {}})
                .has_value());
  }
  d.kill9();
  std::string jp = journal_path(d);
  auto size = std::filesystem::file_size(jp);
  SECTION("torn tail: cut in the last record") {
    std::filesystem::resize_file(jp, size - 10);
    d.start();
    auto c = connect_to(d);
    for (int i = 0; i < 9; ++i) {
      std::string n = "x" + std::to_string(i);
      auto h = read_hash(*c, "j", n);
      REQUIRE(h.has_value());
      CHECK(*h == hash_of(content(n, 4096)));
    }
    CHECK_FALSE(c->open_tensor("j", "x9").has_value());  // its create was the torn record
    CHECK(d.log().find("torn tail") != std::string::npos);
  }
  SECTION("a flipped byte in the middle: tierd refuses to start, the journal is untouched") {
    std::vector<char> bytes(size);
    {
      std::ifstream f(jp, std::ios::binary);
      f.read(bytes.data(), static_cast<std::streamsize>(size));
    }
    bytes[size / 2] ^= 0x5A;
    {
      std::ofstream f(jp, std::ios::binary | std::ios::trunc);
      f.write(bytes.data(), static_cast<std::streamsize>(size));
    }
    int rc = 0;
    std::string out = run_capture(tier::test::bin_path("tierd") + " --socket " + d.dir() +
                                      "/other.sock --state-dir " + d.state_dir() + " --ram 64M",
                                  &rc);
    CHECK(rc == 1);
    CHECK(out.find("cannot recover the catalog") != std::string::npos);
    CHECK(out.find("cannot recover the catalog") == out.rfind("cannot recover the catalog"));  // once
    CHECK(out.find("orrupt") != std::string::npos);
    CHECK(std::filesystem::file_size(jp) == size);
    std::ifstream f(jp, std::ios::binary);
    std::vector<char> after(size);
    f.read(after.data(), static_cast<std::streamsize>(size));
    CHECK(after == bytes);
  }
}

TEST_CASE(
    "a client that lives through a daemon restart reconnects, keeps its lease and mapping, and sees its "
    "data") {
  TestDaemon d;
  auto c = connect_to(d, 10000);
  REQUIRE(c->create_pool("rc", {.ram_quota = 8 << 20}).has_value());
  REQUIRE(put(*c, "rc", "a", 16384));
  auto id = c->open_tensor("rc", "a")->id;
  auto l = c->lease(id, LeaseMode::kRead);
  REQUIRE(l.has_value());
  std::byte* before = l->bytes().data();
  SECTION("kill -9") { d.kill9(); }
  SECTION("SIGTERM") { d.stop(); }
  d.start();
  auto st = c->status();  // reconnects, re-acquires the read lease
  REQUIRE(st.has_value());
  CHECK(st->leases == 1);
  CHECK(l->bytes().data() == before);
  CHECK(hash_of(l->bytes()) == hash_of(content("a", 16384)));
  CHECK(l->release().is_ok());
  REQUIRE(put(*c, "rc", "b", 4096));  // and keeps working
  auto st2 = c->status();
  REQUIRE(st2.has_value());
  CHECK(st2->leases == 0);
  // A lease that cannot come back (its tensor is gone after a reboot) is named in the error.
  auto l2 = c->lease(c->open_tensor("rc", "b")->id, LeaseMode::kRead);
  REQUIRE(l2.has_value());
  d.kill9();
  int rc = 0;
  run_capture(tier::test::bin_path("tierd") + " --state-dir " + d.state_dir() + " --cleanup-arenas", &rc);
  d.start();
  auto st3 = c->status();
  REQUIRE_FALSE(st3.has_value());
  CHECK(st3.error().code() == Code::kUnavailable);
  CHECK(st3.error().message().find("lost") != std::string::npos);
  CHECK(l2->release().code() == Code::kUnavailable);
  CHECK(c->status().has_value());  // the connection itself is back
}

TEST_CASE("a pool's group read access survives kill -9 and restart") {
  TestDaemon d;
  {
    auto c = connect_to(d, 10000);
    REQUIRE(c->create_pool("shared", {.ram_quota = 4 << 20, .group = 4242, .group_read = true}).has_value());
    REQUIRE(c->create_pool("private", {.ram_quota = 4 << 20}).has_value());
  }
  d.kill9();
  d.start();
  auto c = connect_to(d, 10000);
  auto shared = c->open_pool("shared");
  REQUIRE(shared.has_value());
  CHECK(shared->group_read);
  CHECK(shared->group == 4242u);
  auto priv = c->open_pool("private");
  REQUIRE(priv.has_value());
  CHECK_FALSE(priv->group_read);
  CHECK(priv->group == UINT32_MAX);
}
