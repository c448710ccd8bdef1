// tier-bench catalog: does tierd stay fast with a million tensors in one pool? (issue: "The
// catalog and allocator must stay fast with a million tensors in a pool".)
//
// Everything goes through the real daemon and libtier. --clients threads, each with its own
// tier::Client (same uid), create tensors of 64 bytes (one 4 KiB extent each) with distinct
// names into shared pools; every create is journaled and acknowledged after an fdatasync, which
// the daemon's group commit shares between concurrent clients, so creating N tensors needs many
// clients in flight. The pools, in the order they are made:
//   small  1 000 tensors   the baseline pool of the lookup figures
//   base   B = min(10 000, N) tensors, created by the same clients: the create baseline
//   base-r1 .. base-r4   four more rounds of base, each dropped at once (baseline samples)
//   big    N tensors (--tensors, default 1 000 000)
// The create and drop baselines are the median of the five base rounds: one round takes well
// under a second, so a burst of background load on a shared machine would otherwise decide the
// ratio (the big create runs for many seconds and averages such bursts out).
// Lookups (lease, open) run on one client, alternating big and small request by request so that
// background load on a shared machine hits both sides alike.
//
// Figures (baseline measured in the same run; ratio = value / baseline):
//   catalog.create        tensors/s  all N creates into big vs B creates into a base pool (the
//                                    same clients creating into a pool that stays small).
//   catalog.create.tail   tensors/s  the last B creates into big (the catalog at its largest) vs
//                                    the same baseline.
//   catalog.lease.p50/p99 us         lease (read) + release of a random tensor by id in big vs
//                                    in small.
//   catalog.open.p50/p99  us         open_tensor by a random name in big vs in small.
//   catalog.list          tensors/s  Client::list_tensors of all N (the paged TensorList API, one
//                                    request per page) vs listing small, repeated.
//   catalog.daemon_rss    KiB        tierd VmRSS with every pool present vs before the first
//                                    create (clients already connected).
//   catalog.bytes_per_tensor B       tierd RssAnon growth per tensor over the big create vs over
//                                    the small + base creates (1 means memory grows linearly).
//   catalog.drop          ms         drop_pool of big vs drop_pool of a base pool scaled linearly
//                                    to N tensors (ratio > 1: dropping grows faster than linearly).
//   catalog.errors        count      baseline = value, ratio 1; must be 0.
// Every call must succeed and return what was asked for (open returns the created id, list
// returns exactly the created ids): anything else is an error, counted, its first instances
// printed, and the suite exits 1.
//
// Restart time is not measured here: tier-bench does not own the daemon it talks to. --keep
// (with --socket) leaves the three pools in place so that a restart of that tierd can be timed
// from its "recovered ... in X ms" log line (docs/benchmarks.md, "Catalog at 1M tensors").
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "tier/client.hpp"

namespace tier::bench {

namespace {

constexpr uint64_t kTensorBytes = 64;     // metadata-sized; the allocator rounds it to 4 KiB
constexpr uint64_t kExtentBytes = 4096;   // ExtentAllocator::kGranule: what each one occupies
constexpr uint64_t kSmallTensors = 1000;  // the lookup baseline pool
constexpr uint64_t kBaseTensors = 10000;  // the create baseline pool (capped at N)

// quantile() of a copy (callers keep their sample order).
double pct_copy(std::vector<double> v, double q) { return quantile(v, q); }

double ratio(double v, double b) { return b > 0 ? v / b : 0; }

// Errors of every thread: counted, the first few printed at once (a 1M run must not print 1M
// lines when something systematic breaks).
class Errors {
 public:
  void note(const std::string& what, const Status& st) { note(what + ": " + st.to_string()); }
  void note(const std::string& msg) {
    std::lock_guard g(mu_);
    if (++count_ <= 10) std::fprintf(stderr, "tier-bench catalog: %s\n", msg.c_str());
  }
  uint64_t count() const {
    std::lock_guard g(mu_);
    return count_;
  }

 private:
  mutable std::mutex mu_;
  uint64_t count_ = 0;
};

std::string tensor_name(uint64_t i) { return "t" + std::to_string(i); }

struct PoolRun {
  std::string name;
  std::vector<uint64_t> ids;  // ids[i]: the id of tensor_name(i); 0 when its create failed
  double seconds = 0;         // all creates
  double tail_seconds = 0;    // the creates from index tail_from on
};

// Creates pool `name` (quota for `count` extents) and `count` tensors t0..t<count-1> in it, the
// indices handed out to the clients from one shared counter so all of them stay busy to the end.
PoolRun create_pool_of(std::vector<std::unique_ptr<Client>>& clients, const std::string& name, uint64_t count,
                       uint64_t tail_from, bool progress, Errors& err) {
  PoolRun run{name, std::vector<uint64_t>(count, 0), 0, 0};
  uint64_t quota = (count * kExtentBytes + (4ull << 20) + (2ull << 20) - 1) & ~((2ull << 20) - 1);
  if (auto p = clients[0]->create_pool(name, {.ram_quota = quota}); !p) {
    err.note("create_pool " + name, p.error());
    return run;
  }
  std::atomic<uint64_t> next{0}, tail_start_ns{0};
  uint64_t t0 = now_ns();
  std::vector<std::thread> threads;
  for (auto& c : clients)
    threads.emplace_back([&, cl = c.get()] {
      for (;;) {
        uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= count) return;
        if (i == tail_from) tail_start_ns = now_ns();
        if (progress && i > 0 && i % 100000 == 0)
          std::fprintf(stderr, "tier-bench catalog: %s: %llu of %llu created\n", name.c_str(),
                       static_cast<unsigned long long>(i), static_cast<unsigned long long>(count));
        auto t = cl->create_tensor(
            name, {.name = tensor_name(i), .size = kTensorBytes, .shape = {}, .placement = {}});
        if (!t) err.note("create_tensor " + name + "/" + tensor_name(i), t.error());
        else run.ids[i] = t->id;
      }
    });
  for (auto& t : threads) t.join();
  uint64_t t1 = now_ns();
  run.seconds = static_cast<double>(t1 - t0) * 1e-9;
  if (tail_from < count) run.tail_seconds = static_cast<double>(t1 - tail_start_ns.load()) * 1e-9;
  return run;
}

// One lookup of each side per round, the side that goes first alternating, so drift in machine
// load hits both alike. `fn(side, i)` does one timed operation and returns false on error.
void alternate(int rounds, const std::function<bool(int, int)>& fn, std::vector<double>& big_us,
               std::vector<double>& small_us) {
  big_us.reserve(static_cast<size_t>(rounds));
  small_us.reserve(static_cast<size_t>(rounds));
  for (int i = 0; i < rounds; ++i)
    for (int k = 0; k < 2; ++k) {
      int side = (i + k) % 2;  // 0 = big, 1 = small
      uint64_t t0 = now_ns();
      bool ok = fn(side, i);
      double us = static_cast<double>(now_ns() - t0) / 1e3;
      if (ok) (side == 0 ? big_us : small_us).push_back(us);
    }
}

// Lease and open latencies of random tensors of big and small on one client, alternating.
struct Lookups {
  std::vector<double> lease_big, lease_small, open_big, open_small;
};
Lookups time_lookups(Client& one, const PoolRun& big, const PoolRun& small, int rounds, Errors& err) {
  Lookups r;
  std::mt19937_64 rng(42);
  const PoolRun* side_pool[2] = {&big, &small};
  alternate(
      rounds,
      [&](int side, int) {
        const auto& ids = side_pool[side]->ids;
        uint64_t id = ids[rng() % ids.size()];
        auto l = one.lease(id, LeaseMode::kRead);
        if (!l) {
          err.note("lease " + std::to_string(id), l.error());
          return false;
        }
        if (Status st = l->release(); !st) {
          err.note("release " + std::to_string(id), st);
          return false;
        }
        return true;
      },
      r.lease_big, r.lease_small);
  alternate(
      rounds,
      [&](int side, int) {
        const PoolRun& p = *side_pool[side];
        uint64_t i = rng() % p.ids.size();
        auto t = one.open_tensor(p.name, tensor_name(i));
        if (!t) {
          err.note("open_tensor " + p.name + "/" + tensor_name(i), t.error());
          return false;
        }
        if (t->id != p.ids[i]) {
          err.note("open_tensor " + p.name + "/" + tensor_name(i) + " returned id " + std::to_string(t->id) +
                   ", created as " + std::to_string(p.ids[i]));
          return false;
        }
        return true;
      },
      r.open_big, r.open_small);

  return r;
}

// Listing rates, tensors/s: all of big once (first), small repeatedly for about as long as big
// took, at least 3 times (second). Only the list calls are timed; checking the answer against
// the created ids is not.
std::pair<double, double> list_rates(Client& one, const PoolRun& big, const PoolRun& small, Errors& err) {
  auto list_timed = [&](const PoolRun& p, double& seconds) {
    uint64_t t0 = now_ns();
    auto l = one.list_tensors(p.name);
    seconds += static_cast<double>(now_ns() - t0) * 1e-9;
    if (!l) {
      err.note("list_tensors " + p.name, l.error());
      return false;
    }
    std::vector<uint64_t> got, want = p.ids;
    got.reserve(l->size());
    for (const auto& t : *l) got.push_back(t.id);
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    if (got != want) {
      err.note("list_tensors " + p.name + " returned " + std::to_string(got.size()) +
               " tensors that are not the " + std::to_string(want.size()) + " created");
      return false;
    }
    return true;
  };
  double list_big_s = 0, list_small_s = 0;
  (void)list_timed(big, list_big_s);
  uint64_t listed_small = 0;
  for (int i = 0; i < 3 || list_small_s < list_big_s; ++i) {
    if (!list_timed(small, list_small_s)) break;
    listed_small += small.ids.size();
  }
  double list_rate = static_cast<double>(big.ids.size()) / list_big_s;
  double list_base = listed_small > 0 ? static_cast<double>(listed_small) / list_small_s : 0;
  return {list_rate, list_base};
}

// Drops base, big and small; adds base's drop time (s) to `drop_base_s`, returns big's in ms.
double drop_pools(Client& one, const PoolRun& base, const PoolRun& big, const PoolRun& small,
                  std::vector<double>& drop_base_s, Errors& err) {
  uint64_t d0 = now_ns();
  if (Status st = one.drop_pool(base.name); !st) err.note("drop_pool " + base.name, st);
  uint64_t d1 = now_ns();
  if (Status st = one.drop_pool(big.name); !st) err.note("drop_pool " + big.name, st);
  uint64_t d2 = now_ns();
  if (Status st = one.drop_pool(small.name); !st) err.note("drop_pool " + small.name, st);
  drop_base_s.push_back(static_cast<double>(d1 - d0) * 1e-9);
  return static_cast<double>(d2 - d1) / 1e6;
}

}  // namespace

int run_catalog(const BenchOptions& o) {
  const uint64_t n = o.tensors;
  const uint64_t base_n = std::min(kBaseTensors, n);
  const int nclients = o.clients;
  const int rounds = o.quick ? 2000 : 20000;
  const bool progress = !o.json;
  if (o.keep && o.socket.empty()) {
    std::fprintf(stderr,
                 "tier-bench catalog: --keep needs --socket (a private tierd is removed at the end)\n");
    return 1;
  }
  // Private daemon: room for every extent of the three pools, plus slack for arena rounding.
  uint64_t ram = (n + base_n + kSmallTensors) * kExtentBytes + (64ull << 20);
  BenchDaemon daemon;
  if (!daemon.start(o, std::to_string(ram))) return 1;

  Errors err;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < nclients; ++i) {
    auto c = Client::connect(daemon.socket(), {.client_name = "tier-bench-catalog"});
    if (!c) {
      std::fprintf(stderr, "tier-bench catalog: connect %s: %s\n", daemon.socket().c_str(),
                   c.error().to_string().c_str());
      return 1;
    }
    clients.push_back(std::move(*c));
  }
  Client& one = *clients[0];
  pid_t dpid = daemon_pid(daemon.socket());
  double rss0 = proc_status_kib(dpid, "VmRSS"), anon0 = proc_status_kib(dpid, "RssAnon");

  std::string prefix = bench_pool_name("catalog");
  PoolRun small = create_pool_of(clients, prefix + ".small", kSmallTensors, kSmallTensors, false, err);
  PoolRun base = create_pool_of(clients, prefix + ".base", base_n, base_n, false, err);
  double anon1 = proc_status_kib(dpid, "RssAnon");
  // The other four base rounds, after the memory reading: their freed memory is reused by big.
  std::vector<double> create_base_s = {base.seconds}, drop_base_s;
  for (int r = 1; r <= 4; ++r) {
    PoolRun extra =
        create_pool_of(clients, prefix + ".base-r" + std::to_string(r), base_n, base_n, false, err);
    create_base_s.push_back(extra.seconds);
    uint64_t d0 = now_ns();
    if (Status st = one.drop_pool(extra.name); !st) err.note("drop_pool " + extra.name, st);
    drop_base_s.push_back(static_cast<double>(now_ns() - d0) * 1e-9);
  }
  if (progress)
    std::fprintf(stderr, "tier-bench catalog: creating %llu tensors with %d clients\n",
                 static_cast<unsigned long long>(n), nclients);
  // A daemon that already refuses creates would refuse N more: report what failed instead.
  PoolRun big{prefix + ".big", {}, 0, 0};
  if (err.count() == 0) big = create_pool_of(clients, big.name, n, n - base_n, progress, err);
  double rss2 = proc_status_kib(dpid, "VmRSS"), anon2 = proc_status_kib(dpid, "RssAnon");
  if (err.count() > 0) {
    std::fprintf(stderr, "tier-bench catalog: %llu errors while creating; stopping\n",
                 static_cast<unsigned long long>(err.count()));
    for (auto* p : {&big, &base, &small}) (void)one.drop_pool(p->name);
    emit(o, {"catalog.errors", std::nullopt, static_cast<double>(err.count()), "errors",
             static_cast<double>(err.count()), 1});
    return 1;
  }

  double create_base = static_cast<double>(base_n) / median(create_base_s);
  double create = static_cast<double>(n) / big.seconds;
  double create_tail = static_cast<double>(base_n) / big.tail_seconds;

  // Lookups on one client: random tensors of big and small, alternating.
  Lookups lk = time_lookups(one, big, small, rounds, err);
  auto [list_rate, list_base] = list_rates(one, big, small, err);
  // Drop (unless --keep): base first, the third sample of the drop baseline.
  double drop_big_ms = 0, drop_base_ms = 0;
  if (!o.keep) {
    drop_big_ms = drop_pools(one, base, big, small, drop_base_s, err);
    drop_base_ms = median(drop_base_s) * 1e3 * static_cast<double>(n) / static_cast<double>(base_n);
  }
  emit(o, {"catalog.create", std::nullopt, create, "tensors/s", create_base, ratio(create, create_base)});
  emit(o, {"catalog.create.tail", std::nullopt, create_tail, "tensors/s", create_base,
           ratio(create_tail, create_base)});
  for (auto [name, q] : {std::pair{"p50", 0.5}, {"p99", 0.99}}) {
    double v = pct_copy(lk.lease_big, q), b = pct_copy(lk.lease_small, q);
    emit(o, {std::string("catalog.lease.") + name, std::nullopt, v, "us", b, ratio(v, b)});
  }
  for (auto [name, q] : {std::pair{"p50", 0.5}, {"p99", 0.99}}) {
    double v = pct_copy(lk.open_big, q), b = pct_copy(lk.open_small, q);
    emit(o, {std::string("catalog.open.") + name, std::nullopt, v, "us", b, ratio(v, b)});
  }
  emit(o, {"catalog.list", std::nullopt, list_rate, "tensors/s", list_base, ratio(list_rate, list_base)});
  emit(o, {"catalog.daemon_rss", std::nullopt, rss2, "KiB", rss0, ratio(rss2, rss0)});
  double bpt = (anon2 - anon1) * 1024 / static_cast<double>(n);
  double bpt_base = (anon1 - anon0) * 1024 / static_cast<double>(kSmallTensors + base_n);
  emit(o, {"catalog.bytes_per_tensor", std::nullopt, bpt, "B", bpt_base, ratio(bpt, bpt_base)});
  if (!o.keep)
    emit(o,
         {"catalog.drop", std::nullopt, drop_big_ms, "ms", drop_base_ms, ratio(drop_big_ms, drop_base_ms)});
  uint64_t errors = err.count();
  emit(o, {"catalog.errors", std::nullopt, static_cast<double>(errors), "errors", static_cast<double>(errors),
           1});
  if (errors > 0) {
    std::fprintf(stderr, "tier-bench catalog: %llu errors\n", static_cast<unsigned long long>(errors));
    return 1;
  }
  if (rss0 <= 0 || anon2 <= 0) {
    std::fprintf(stderr, "tier-bench catalog: could not read tierd's memory from /proc/%d/status\n",
                 static_cast<int>(dpid));
    return 1;
  }
  return 0;
}

}  // namespace tier::bench
