// By hand: build-X/bin/durability_bench [TENSORS] [TENSOR_KIB]
// Restart time (tierd start -> accepting) with TENSORS tensors in its journal, after kill -9
// (arenas re-attached) and after a simulated reboot (restored from a snapshot), and the snapshot
// stall for the pool, each next to a baseline: a start with an empty state dir, and a memcpy of
// the same bytes. One JSON line per figure.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"
#include "base/errors.hpp"

using namespace tier;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
void line(const char* name, uint64_t bytes, double value, const char* unit, double baseline) {
  std::printf(
      "{\"name\":\"%s\",\"bytes\":%llu,\"value\":%.3f,\"unit\":\"%s\",\"baseline\":%.3f,\"ratio\":%.3f}\n",
      name, static_cast<unsigned long long>(bytes), value, unit, baseline,
      baseline > 0 ? value / baseline : 0.0);
}
}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 2000;
  uint64_t kib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64;
  uint64_t size = kib << 10;
  test::DaemonOptions o;
  o.ram = std::to_string((n * size * 2 >> 20) + 256) + "M";
  test::TestDaemon d(o);
  auto t0 = Clock::now();
  d.stop();
  d.start();
  double empty_ms = ms_since(t0);  // includes a clean stop; the baseline start below is purer
  t0 = Clock::now();
  d.kill9();
  d.start();
  double empty_start = ms_since(t0);
  auto c = Client::connect(d.socket());
  if (!c) return 1;
  if (auto p = (*c)->create_pool("bench", {.ram_quota = n * size + (64 << 20)}); !p) {
    std::fprintf(stderr, "create_pool: %s\n", p.error().message().c_str());
    return 1;
  }
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    TensorDesc desc;
    desc.name = "t" + std::to_string(i);
    desc.size = size;
    auto t = (*c)->create_tensor("bench", desc);
    auto l = t ? (*c)->lease(t->id, LeaseMode::kWrite) : fail(t.error());
    if (!l) {
      std::fprintf(stderr, "tensor %d: %s\n", i, l.error().message().c_str());
      return 1;
    }
    std::memset(l->bytes().data(), i & 0xff, size);
  }
  double create_ms = ms_since(t0);
  line("durability.create_fsynced", size, create_ms * 1000 / n, "us/tensor", 0);
  // Snapshot stall vs a memcpy of the same bytes.
  std::vector<std::byte> a(n * size, std::byte{1}), b(n * size);
  t0 = Clock::now();
  std::memcpy(b.data(), a.data(), a.size());
  double memcpy_us = ms_since(t0) * 1000;
  t0 = Clock::now();
  auto s = (*c)->snapshot("bench");
  if (!s) {
    std::fprintf(stderr, "%s\n", s.error().message().c_str());
    return 1;
  }
  double snap_ms = ms_since(t0);
  line("durability.snapshot_stall", s->bytes, static_cast<double>(s->stall_us), "us", memcpy_us);
  line("durability.snapshot_durable", s->bytes, snap_ms, "ms", 0);
  c->reset();
  t0 = Clock::now();
  d.kill9();
  d.start();
  line("durability.restart_to_ready", static_cast<uint64_t>(n), ms_since(t0), "ms", empty_start);
  d.kill9();
  std::string cmd =
      test::bin_path("tierd") + " --state-dir " + d.state_dir() + " --cleanup-arenas >/dev/null";
  if (std::system(cmd.c_str()) != 0) return 1;
  t0 = Clock::now();
  d.start();
  line("durability.reboot_restore_to_ready", n * size, ms_since(t0), "ms", empty_start);
  (void)empty_ms;
  return 0;
}
