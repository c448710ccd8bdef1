// By hand: build-X/bin/snapshot_bench SOCKET [GIB] [TENSOR_MIB] (docs/benchmarks.md,
// "Snapshots").
// Lease latency of other clients while a pool of GIB GiB is snapshotted, next to the same
// clients' latency on the idle daemon. Against a running tierd (any version speaking this
// protocol, so the same binary measures before and after a change): it creates the pools
// `snapbench-big` (GIB GiB of TENSOR_MIB MiB tensors) and `snapbench-other` (one 4 KiB
// tensor), then two clients lease and release that small tensor 1000 times a second each while
// a third takes the snapshot. Each lease's latency counts from when it was due (the schedule),
// not from when it was sent, so a stalled loop shows in every lease it held up rather than in
// one sample (no coordinated omission). One JSON line per figure; the pools are dropped at the
// end.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tier/client.hpp"
#include "base/errors.hpp"

using namespace tier;
using Clock = std::chrono::steady_clock;

namespace {

struct Samples {
  std::mutex mu;
  std::vector<double> idle_us, during_us;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

void report(const char* phase, const std::vector<double>& v) {
  std::printf(
      "{\"name\":\"snapshot.other_client_lease_us\",\"phase\":\"%s\",\"samples\":%zu,"
      "\"p50\":%.1f,\"p99\":%.1f,\"p999\":%.1f,\"max\":%.1f}\n",
      phase, v.size(), pct(v, 0.50), pct(v, 0.99), pct(v, 0.999), pct(v, 1.0));
}

std::unique_ptr<Client> connect(const std::string& sock, const char* name) {
  auto c = Client::connect(sock, {.client_name = name});
  if (!c) {
    std::fprintf(stderr, "connect %s: %s\n", sock.c_str(), c.error().message().c_str());
    std::exit(1);
  }
  return std::move(*c);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: snapshot_bench SOCKET [GIB] [TENSOR_MIB]\n");
    return 2;
  }
  const std::string sock = argv[1];
  const uint64_t gib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 2;
  const uint64_t tensor = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64) << 20;
  const uint64_t n = (gib << 30) / tensor;
  auto c = connect(sock, "snapbench");
  (void)c->drop_pool("snapbench-big");
  (void)c->drop_pool("snapbench-other");
  if (auto p = c->create_pool("snapbench-big", {.ram_quota = n * tensor}); !p) {
    std::fprintf(stderr, "create_pool: %s\n", p.error().message().c_str());
    return 1;
  }
  if (auto p = c->create_pool("snapbench-other", {.ram_quota = 4 << 20}); !p) return 1;
  for (uint64_t i = 0; i < n; ++i) {
    TensorDesc d;
    d.name = "t" + std::to_string(i);
    d.size = tensor;
    auto t = c->create_tensor("snapbench-big", d);
    auto l = t ? c->lease(t->id, LeaseMode::kWrite) : fail(t.error());
    if (!l) {
      std::fprintf(stderr, "tensor %llu: %s\n", static_cast<unsigned long long>(i),
                   l.error().message().c_str());
      return 1;
    }
    std::memset(l->bytes().data(), static_cast<int>(i & 0xff), tensor);
  }
  TensorDesc od;
  od.name = "small";
  od.size = 4096;
  auto small = c->create_tensor("snapbench-other", od);
  if (!small) return 1;

  std::atomic<int> phase{0};  // 0 idle, 1 snapshot running, 2 stop
  Samples s;
  std::vector<std::thread> others;
  for (int k = 0; k < 2; ++k)
    others.emplace_back([&, k] {
      auto oc = connect(sock, k == 0 ? "other-0" : "other-1");
      std::vector<double> idle, during;
      auto due = Clock::now();
      for (int ph; (ph = phase.load()) != 2; due += std::chrono::milliseconds(1)) {
        std::this_thread::sleep_until(due);
        auto l = oc->lease(small->id, LeaseMode::kRead, {.timeout_ms = 60000});
        double us = std::chrono::duration<double, std::micro>(Clock::now() - due).count();
        if (!l) continue;
        // A lease due while idle that the snapshot's start held up counts as during it.
        (ph == 0 && phase.load() == 0 ? idle : during).push_back(us);
        (void)l->release();
      }
      std::lock_guard g(s.mu);
      s.idle_us.insert(s.idle_us.end(), idle.begin(), idle.end());
      s.during_us.insert(s.during_us.end(), during.begin(), during.end());
    });
  std::this_thread::sleep_for(std::chrono::seconds(3));
  auto sc = connect(sock, "snapshotter");
  phase = 1;
  auto t0 = Clock::now();
  auto snap = sc->snapshot("snapbench-big");
  double snap_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  phase = 2;
  for (auto& t : others) t.join();
  if (!snap) {
    std::fprintf(stderr, "snapshot: %s\n", snap.error().message().c_str());
    return 1;
  }
  report("idle", s.idle_us);
  report("during_snapshot", s.during_us);
  std::printf("{\"name\":\"snapshot.durable_ms\",\"bytes\":%llu,\"value\":%.1f,\"loop_us\":%llu}\n",
              static_cast<unsigned long long>(snap->bytes), snap_ms,
              static_cast<unsigned long long>(snap->stall_us));
  (void)c->drop_pool("snapbench-big");
  (void)c->drop_pool("snapbench-other");
  return 0;
}
