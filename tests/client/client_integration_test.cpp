// libtier against a real tierd on a temporary socket: lifecycle, zero-copy data, batched and
// conflicting leases, clients that die, many clients at once, and a daemon that dies.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "support/daemon_fixture.hpp"
#include "support/tier_test_util.hpp"
#include "tier/client.hpp"

using namespace tier;
using tier::test::connect_to;
using tier::test::DaemonOptions;
using tier::test::desc;
using tier::test::TestDaemon;

namespace {

uint64_t make_tensor(Client& c, const std::string& pool, const std::string& name, uint64_t size) {
  auto t = c.create_tensor(pool, desc(name, size));
  REQUIRE(t.has_value());
  return t->id;
}

void fill_pattern(std::span<std::byte> b, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<std::byte>(x);
  }
}

bool has_pattern(std::span<const std::byte> b, uint32_t seed) {
  std::vector<std::byte> want(b.size());
  fill_pattern(want, seed);
  return std::memcmp(want.data(), b.data(), b.size()) == 0;
}

// A TestDaemon that drops every pool when the test case ends, so the daemon unlinks their
// shared-memory arenas (tierd keeps arenas of live pools in /dev/shm across restarts by design).
// The drop runs after the test's own clients (declared later) are gone, before tierd stops.
struct DaemonDroppingPools : TestDaemon {
  using TestDaemon::TestDaemon;
  ~DaemonDroppingPools() {
    if (!running()) return;
    auto c = Client::connect(socket());
    if (!c) return;
    if (auto pools = (*c)->list_pools())
      for (const auto& p : *pools) (void)(*c)->drop_pool(p.name);
  }
};

}  // namespace

TEST_CASE("pools and tensors: create, open, list, delete, drop") {
  DaemonDroppingPools d;
  auto c = connect_to(d);
  auto p = c->create_pool("job1", {.ram_quota = 64 << 20});
  REQUIRE(p.has_value());
  CHECK(p->name == "job1");
  CHECK(p->owner_uid == ::getuid());
  CHECK(c->create_pool("job1").error().code() == Code::kAlreadyExists);
  auto again = c->create_pool("job1", {}, /*exist_ok=*/true);
  REQUIRE(again.has_value());
  CHECK(again->id == p->id);
  CHECK(c->create_pool("bad/name").error().code() == Code::kInvalidArgument);
  CHECK(c->open_pool("nope").error().code() == Code::kNotFound);

  TensorDesc td = desc("w0", 12345);
  td.dtype = DType::kF32;
  td.shape = {3, 5};
  auto t = c->create_tensor("job1", td);
  REQUIRE(t.has_value());
  CHECK(t->size == 12345);
  CHECK(t->dtype == DType::kF32);
  CHECK(t->shape == std::vector<int64_t>{3, 5});
  CHECK(c->create_tensor("job1", td).error().code() == Code::kAlreadyExists);
  auto same = c->create_tensor("job1", td, /*exist_ok=*/true);
  REQUIRE(same.has_value());
  CHECK(same->id == t->id);
  auto opened = c->open_tensor("job1", "w0");
  REQUIRE(opened.has_value());
  CHECK(opened->id == t->id);
  CHECK(c->open_tensor("job1", "nope").error().code() == Code::kNotFound);
  CHECK(c->create_tensor("nope", desc("x", 1)).error().code() == Code::kNotFound);
  CHECK(c->create_tensor("job1", desc("zero", 0)).error().code() == Code::kInvalidArgument);

  // Enough tensors with long names that listing needs several reply pages.
  const std::string prefix(200, 'n');
  for (int i = 0; i < 400; ++i) make_tensor(*c, "job1", prefix + std::to_string(i), 64);
  auto list = c->list_tensors("job1");
  REQUIRE(list.has_value());
  CHECK(list->size() == 401);
  for (size_t i = 1; i < list->size(); ++i) CHECK((*list)[i - 1].id < (*list)[i].id);

  auto pools = c->list_pools();
  REQUIRE(pools.has_value());
  REQUIRE(pools->size() == 1);
  CHECK((*pools)[0].tensor_count == 401);

  CHECK(c->delete_tensor("job1", "w0").is_ok());
  CHECK(c->open_tensor("job1", "w0").error().code() == Code::kNotFound);
  CHECK(c->delete_tensor("job1", "w0").code() == Code::kNotFound);
  CHECK(c->drop_pool("job1").is_ok());
  CHECK(c->open_pool("job1").error().code() == Code::kNotFound);
  CHECK(c->list_pools()->empty());
}

TEST_CASE("bytes written through a lease read back bit-exact, zero-copy, from another client") {
  DaemonDroppingPools d;
  auto a = connect_to(d, "writer");
  auto b = connect_to(d, "reader");
  REQUIRE(a->create_pool("p", {.ram_quota = 64 << 20}).has_value());
  const uint64_t size = 3 * 1024 * 1024 + 17;
  uint64_t id = make_tensor(*a, "p", "t", size);
  {
    auto w = a->lease(id, LeaseMode::kWrite);
    REQUIRE(w.has_value());
    REQUIRE(w->bytes().size() == size);
    fill_pattern(w->bytes(), 1);
    // The span lies inside an arena this client mapped: no copy anywhere.
    bool inside = false;
    for (const auto& m : a->mapped_arenas())
      inside |= w->bytes().data() >= m.base && w->bytes().data() + size <= m.base + m.size;
    CHECK(inside);
    CHECK(w->release().is_ok());
    CHECK_FALSE(w->valid());
  }
  auto r1 = b->lease(id, LeaseMode::kRead);
  REQUIRE(r1.has_value());
  CHECK(has_pattern(r1->bytes(), 1));
  auto r2 = a->lease(id, LeaseMode::kRead);  // read leases share
  REQUIRE(r2.has_value());
  CHECK(r1->release().is_ok());
  CHECK(r2->release().is_ok());

  // A second write is seen by the other client through the mapping it already holds.
  {
    auto w = a->lease(id, LeaseMode::kWrite);
    REQUIRE(w.has_value());
    fill_pattern(w->bytes(), 2);
  }  // released by the destructor
  auto r3 = b->lease(id, LeaseMode::kRead);
  REQUIRE(r3.has_value());
  CHECK(has_pattern(r3->bytes(), 2));
  CHECK(b->mapped_arenas().size() == 1);
}

TEST_CASE("a batch of leases is granted whole or not at all") {
  DaemonDroppingPools d;
  auto a = connect_to(d);
  auto other = connect_to(d);
  REQUIRE(a->create_pool("p", {.ram_quota = 64 << 20}).has_value());
  std::vector<uint64_t> ids;
  ids.reserve(4);
  for (int i = 0; i < 4; ++i) ids.push_back(make_tensor(*a, "p", "t" + std::to_string(i), 4096));

  auto held = other->lease(ids[2], LeaseMode::kWrite);
  REQUIRE(held.has_value());
  auto batch = a->lease_batch(ids, LeaseMode::kWrite);
  REQUIRE_FALSE(batch.has_value());
  CHECK(batch.error().code() == Code::kBusy);
  // Nothing of the failed batch is held: another client gets tensor 0 at once.
  {
    auto t0 = other->lease(ids[0], LeaseMode::kWrite);
    CHECK(t0.has_value());
  }
  std::vector<uint64_t> with_missing = {ids[0], 999999};
  auto missing = a->lease_batch(with_missing, LeaseMode::kRead);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code() == Code::kNotFound);
  CHECK(other->lease(ids[0], LeaseMode::kWrite).has_value());

  CHECK(held->release().is_ok());
  auto ok = a->lease_batch(ids, LeaseMode::kWrite);
  REQUIRE(ok.has_value());
  REQUIRE(ok->size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK((*ok)[i].tensor_id() == ids[i]);
    CHECK((*ok)[i].bytes().size() == 4096);
  }
  CHECK(other->lease(ids[3], LeaseMode::kRead).error().code() == Code::kBusy);
  CHECK(a->release_batch(*ok).is_ok());
  CHECK(other->lease(ids[3], LeaseMode::kRead).has_value());
}

TEST_CASE("a batch larger than one reply still comes back whole") {
  DaemonOptions opts;
  opts.ram = "1G";
  DaemonDroppingPools d(opts);
  auto a = connect_to(d);
  REQUIRE(a->create_pool("p", {.ram_quota = 512ull << 20}).has_value());
  std::vector<uint64_t> ids;
  ids.reserve(1500);
  for (int i = 0; i < 1500; ++i) ids.push_back(make_tensor(*a, "p", "t" + std::to_string(i), 64));
  auto ls = a->lease_batch(ids, LeaseMode::kRead);
  REQUIRE(ls.has_value());
  REQUIRE(ls->size() == ids.size());
  CHECK(ls->back().tensor_id() == ids.back());
  CHECK(a->release_batch(*ls).is_ok());
  auto w = a->lease(ids.back(), LeaseMode::kWrite);
  CHECK(w.has_value());
}

TEST_CASE("conflicting leases fail fast, time out, or wait until released") {
  DaemonDroppingPools d;
  auto a = connect_to(d);
  auto b = connect_to(d);
  REQUIRE(a->create_pool("p", {.ram_quota = 16 << 20}).has_value());
  uint64_t id = make_tensor(*a, "p", "t", 4096);

  auto w = a->lease(id, LeaseMode::kWrite);
  REQUIRE(w.has_value());
  auto busy = b->lease(id, LeaseMode::kRead);
  REQUIRE_FALSE(busy.has_value());
  CHECK(busy.error().code() == Code::kBusy);
  auto busy_w = b->lease(id, LeaseMode::kWrite);
  CHECK(busy_w.error().code() == Code::kBusy);

  auto timed = b->lease(id, LeaseMode::kRead, LeaseWait{100});
  REQUIRE_FALSE(timed.has_value());
  CHECK(timed.error().code() == Code::kTimeout);

  std::atomic<bool> released{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    released = true;
    CHECK(w->release().is_ok());
  });
  auto waited = b->lease(id, LeaseMode::kWrite, LeaseWait{LeaseWait::kForever});
  releaser.join();
  REQUIRE(waited.has_value());
  CHECK(released.load());
  CHECK(waited->mode() == LeaseMode::kWrite);

  // A reader blocks a writer; readers share.
  CHECK(waited->release().is_ok());
  auto r1 = a->lease(id, LeaseMode::kRead);
  auto r2 = b->lease(id, LeaseMode::kRead);
  CHECK(r1.has_value());
  CHECK(r2.has_value());
  CHECK(b->lease(id, LeaseMode::kWrite).error().code() == Code::kBusy);
}

TEST_CASE("a client killed with -9 has its leases released") {
  DaemonDroppingPools d;
  auto a = connect_to(d);
  REQUIRE(a->create_pool("p", {.ram_quota = 16 << 20}).has_value());
  uint64_t id = make_tensor(*a, "p", "t", 4096);
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto c = Client::connect(d.socket());
    if (!c) _exit(2);
    auto l = (*c)->lease(id, LeaseMode::kWrite);
    if (!l) _exit(3);
    char one = 1;
    if (write(ready[1], &one, 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char got = 0;
  REQUIRE(read(ready[0], &got, 1) == 1);
  close(ready[0]);
  CHECK(a->lease(id, LeaseMode::kRead).error().code() == Code::kBusy);
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  auto l = a->lease(id, LeaseMode::kWrite, LeaseWait{5000});
  REQUIRE(l.has_value());
}

TEST_CASE("a forked child cannot use its parent's client; the parent's goes on") {
  // A child (a DataLoader worker) must connect its own client: the inherited one is closed in
  // the child, so it neither keeps the parent's session (and leases) alive after the parent
  // dies nor reads the parent's replies. Before: the child's call went over the parent's socket.
  DaemonDroppingPools d;
  auto a = connect_to(d);
  REQUIRE(a->create_pool("p", {.ram_quota = 16 << 20}).has_value());
  uint64_t id = make_tensor(*a, "p", "t", 4096);
  auto held = a->lease(id, LeaseMode::kWrite);
  REQUIRE(held.has_value());
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto pools = a->list_pools();
    if (pools || pools.error().code() != Code::kUnsupported) _exit(1);
    auto c = Client::connect(d.socket());  // its own works
    _exit(c && (*c)->list_pools() ? 0 : 2);
  }
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  CHECK(a->list_pools().has_value());
  CHECK(held->release().is_ok());
}

TEST_CASE("many clients at once: threads with their own clients, one shared client, processes") {
  DaemonDroppingPools d;
  auto admin = connect_to(d);
  REQUIRE(admin->create_pool("p", {.ram_quota = 128 << 20}).has_value());
  constexpr int kThreads = 8, kProcs = 4, kRounds = 50;
  std::vector<uint64_t> own;
  own.reserve(kThreads + kProcs);
  for (int i = 0; i < kThreads + kProcs; ++i)
    own.push_back(make_tensor(*admin, "p", "own" + std::to_string(i), 8192));
  uint64_t shared_id = make_tensor(*admin, "p", "shared", 8192);
  uint64_t counter_id = make_tensor(*admin, "p", "counter", 8);
  {
    auto w = admin->lease(counter_id, LeaseMode::kWrite);
    REQUIRE(w.has_value());
    std::memset(w->bytes().data(), 0, 8);
  }

  // Each worker: private tensor round trips, shared reads, and increments of a counter under a
  // waiting write lease (lost updates would show a lease that was not exclusive).
  std::mutex err_mu;
  std::string first_error;
  auto note = [&](const std::string& what, const Status& st) {
    std::lock_guard g(err_mu);
    if (first_error.empty()) first_error = what + ": " + st.to_string();
    return false;
  };
  auto work = [&](Client& c, int i) -> bool {
    for (int r = 0; r < kRounds; ++r) {
      {
        auto w = c.lease(own[i], LeaseMode::kWrite);
        if (!w) return note("own write lease", w.error());
        fill_pattern(w->bytes(), i * 1000 + r);
      }
      {
        auto rd = c.lease(own[i], LeaseMode::kRead);
        if (!rd) return note("own read lease", rd.error());
        if (!has_pattern(rd->bytes(), i * 1000 + r))
          return note("own read", Status(Code::kCorruption, "pattern"));
      }
      {
        auto rd = c.lease(shared_id, LeaseMode::kRead, LeaseWait{10000});
        if (!rd) return note("shared read lease", rd.error());
      }
      auto w = c.lease(counter_id, LeaseMode::kWrite, LeaseWait{10000});
      if (!w) return note("counter write lease", w.error());
      uint64_t v;
      std::memcpy(&v, w->bytes().data(), 8);
      ++v;
      std::memcpy(w->bytes().data(), &v, 8);
    }
    return true;
  };

  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      auto c = Client::connect(d.socket());
      bool ok = c && work(**c, kThreads + p);
      if (!ok) std::fprintf(stderr, "process worker %d: %s\n", p, first_error.c_str());
      _exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads / 2);
  for (int t = 0; t < kThreads / 2; ++t)
    threads.emplace_back([&, t] {
      auto c = Client::connect(d.socket());
      if (!c || !work(**c, t)) ++failures;
    });
  auto shared_client = connect_to(d, "shared");
  for (int t = kThreads / 2; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      if (!work(*shared_client, t)) ++failures;
    });
  for (auto& th : threads) th.join();
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  }
  CHECK(failures == 0);
  CHECK(first_error == "");
  auto r = admin->lease(counter_id, LeaseMode::kRead);
  REQUIRE(r.has_value());
  uint64_t v;
  std::memcpy(&v, r->bytes().data(), 8);
  CHECK(v == uint64_t{kThreads + kProcs} * kRounds);
}

TEST_CASE("a daemon killed mid-session turns calls into Unavailable, never a crash") {
  DaemonDroppingPools d;
  // No reconnecting: every call must fail at once (tests/durability covers reconnects).
  auto cr = Client::connect(
      d.socket(), {.client_name = "no-reconnect", .reconnect_timeout = std::chrono::milliseconds(0)});
  REQUIRE(cr.has_value());
  auto c = std::move(*cr);
  REQUIRE(c->create_pool("p", {.ram_quota = 16 << 20}).has_value());
  uint64_t id = make_tensor(*c, "p", "t", 4096);
  auto l = c->lease(id, LeaseMode::kWrite);
  REQUIRE(l.has_value());
  std::memset(l->bytes().data(), 1, 4096);  // the mapping survives the daemon
  d.kill9();
  auto p = c->list_pools();
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code() == Code::kUnavailable);
  CHECK(c->lease(id, LeaseMode::kRead).error().code() == Code::kUnavailable);
  CHECK(c->status().error().code() == Code::kUnavailable);
  CHECK(l->release().code() == Code::kUnavailable);
  CHECK(static_cast<int>(l->bytes().size()) == 0);  // released (even if unsuccessfully): no span
  d.start();  // so the janitor can drop the pool the restarted daemon re-attached
}

TEST_CASE("connect retries until a starting daemon accepts") {
  DaemonDroppingPools d;
  d.stop();
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    d.start();
  });
  auto c = Client::connect(d.socket(), {.client_name = "retry", .connect_timeout = std::chrono::seconds(10)});
  starter.join();
  REQUIRE(c.has_value());
  CHECK((*c)->status().has_value());
}

TEST_CASE("status, topology and the tiering calls answer with a value or a clear Status") {
  DaemonDroppingPools d;
  auto c = connect_to(d);
  auto s = c->status();
  REQUIRE(s.has_value());
  CHECK_FALSE(s->daemon_version.empty());
  CHECK(s->clients >= 1);
  CHECK_FALSE(s->ram.empty());
  auto t = c->topology();
  REQUIRE(t.has_value());
  CHECK_FALSE(t->nodes.empty());
  REQUIRE(c->create_pool("p", {.ram_quota = 16 << 20}).has_value());
  uint64_t id = make_tensor(*c, "p", "t", 4096);
  auto ok_or_unsupported = [](const Status& st) { return st.is_ok() || st.code() == Code::kUnsupported; };
  CHECK(ok_or_unsupported(c->prefetch("p", {&id, 1})));
  CHECK(ok_or_unsupported(c->evict("p", {&id, 1})));
  CHECK(ok_or_unsupported(c->set_plan("p", {&id, 1}, 0)));
  auto snap = c->snapshot("p");
  CHECK((snap.has_value() || ok_or_unsupported(snap.error())));
  auto m = c->metrics();
  CHECK((m.has_value() || m.error().code() == Code::kUnsupported));
}

TEST_CASE("a thread waiting for a lease does not lock its sibling out of the shared client") {
  DaemonDroppingPools d;
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p", {.ram_quota = 16 << 20}).has_value());
  uint64_t id = make_tensor(*c, "p", "t", 4096);
  auto held = c->lease(id, LeaseMode::kWrite);
  REQUIRE(held.has_value());
  Status released;
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    released = held->release();  // same Client as the waiter below
  });
  auto waited = c->lease(id, LeaseMode::kWrite, LeaseWait{5000});
  holder.join();
  CHECK(released.is_ok());
  REQUIRE(waited.has_value());
  CHECK(waited->bytes().size() == 4096);
}
