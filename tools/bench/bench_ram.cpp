// tier-bench ram: bandwidth of the RAM tier through leases vs memcpy between private buffers.
//
// What is measured, per tensor size (1 MiB .. 1 GiB; --quick: 1 and 64 MiB):
//   ram.read.held         memcpy(private dst <- tensor bytes) under a read lease held throughout
//   ram.write.held        memcpy(tensor bytes <- private src) under a write lease held throughout
//   ram.read.lease_cycle  lease(read) + the same copy + release, per copy
//   ram.write.lease_cycle lease(write) + the same copy + release, per copy
// Baseline of every figure: memcpy(private dst <- private src) of the same size, with the same
// two private buffers the measured copy uses on its private side, so the only difference is
// that one side lives in the daemon's shared arena instead of private memory. All buffers are
// touched before timing (no page faults measured). Measured and baseline samples interleave;
// each value is the best sample's bytes / mean time per copy, in GB/s (1e9 B/s), for both sides.
// Sizes up to 16 MiB fit this machine's L3, so those figures are cache bandwidth for both sides.
// With a private tierd, tier-bench and tierd are pinned to one CPU, so the wake-ups of a lease
// cycle hand the CPU over directly instead of waiting for another (possibly busy or idle-halted)
// CPU; a tierd given by --socket is left where it is.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "bench_common.hpp"
#include "tier/client.hpp"
#include "base/sizes.hpp"

namespace tier::bench {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

Buffer alloc_touched(size_t n, int fill) {
  // Page aligned like an arena extent; no madvise(MADV_HUGEPAGE), so both sides use the same
  // page size unless the system forces transparent huge pages on private memory.
  void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  if (p) std::memset(p, fill, n);
  return Buffer(static_cast<std::byte*>(p));
}

int fail_msg(const std::string& what, const Status& st) {
  std::fprintf(stderr, "tier-bench ram: %s: %s\n", what.c_str(), st.to_string().c_str());
  return 1;
}

}  // namespace

int run_ram(const BenchOptions& o) {
  std::vector<uint64_t> sizes = o.quick ? std::vector<uint64_t>{1ull << 20, 64ull << 20}
                                        : std::vector<uint64_t>{1ull << 20,  4ull << 20,   16ull << 20,
                                                                64ull << 20, 256ull << 20, 1ull << 30};
  const uint64_t max_size = sizes.back();
  // Per sample, copy at least this many bytes; sample count per figure.
  // Many short samples rather than a few long ones: with best-of, a short sample has a better
  // chance of running undisturbed on a busy machine.
  const uint64_t sample_bytes = o.quick ? (32ull << 20) : (64ull << 20);
  const int samples = o.quick ? 3 : 15;

  BenchDaemon daemon;
  // Room for the largest tensor at 2 MiB alignment plus slack for the allocator.
  if (!daemon.start(o, o.quick ? "256M" : "1280M")) return 1;
  const std::vector<int> cpus = daemon.is_private() ? allowed_cpus() : std::vector<int>{};
  if (!cpus.empty() && !(pin(0, cpus[0]) && pin_process(daemon.pid(), cpus[0]))) {
    std::fprintf(stderr, "tier-bench ram: sched_setaffinity: %s\n", std::strerror(errno));
    return 1;
  }
  struct Unpin {
    const std::vector<int>& cpus;
    ~Unpin() { unpin_self(cpus); }
  } unpin{cpus};
  auto client = Client::connect(daemon.socket(), {.client_name = "tier-bench"});
  if (!client) return fail_msg("connect to " + daemon.socket(), client.error());
  Client& c = **client;
  std::string pool = bench_pool_name("ram");
  auto p = c.create_pool(pool, {.ram_quota = max_size + (64ull << 20)});
  if (!p) return fail_msg("create pool " + pool, p.error());

  Buffer src = alloc_touched(max_size, 0x5a), dst = alloc_touched(max_size, 0);
  if (!src || !dst) {
    std::fprintf(stderr, "tier-bench ram: cannot allocate 2 x %s of private buffers\n",
                 format_size(max_size).c_str());
    (void)c.drop_pool(pool);
    return 1;
  }

  int rc = 0;
  for (uint64_t n : sizes) {
    std::string name = "t" + std::to_string(n);
    auto t = c.create_tensor(pool, {.name = name, .size = n, .shape = {}, .placement = {}});
    if (!t) {
      rc = fail_msg("create tensor of " + format_size(n), t.error());
      break;
    }
    uint64_t id = t->id;
    {  // Fault the tensor's pages in, and give it known content.
      auto w = c.lease(id, LeaseMode::kWrite);
      if (!w) {
        rc = fail_msg("write lease", w.error());
        break;
      }
      std::memcpy(w->bytes().data(), src.get(), n);
    }
    const int iters = static_cast<int>(std::max<uint64_t>(1, sample_bytes / n));
    std::byte* s = src.get();
    std::byte* d = dst.get();
    auto baseline = [&] {
      std::memcpy(d, s, n);
      return true;
    };
    auto gbps = [&](double seconds) { return seconds > 0 ? n / seconds / 1e9 : 0.0; };
    auto report = [&](const char* fig, const PairResult& r) {
      if (r.measured_s < 0) return false;
      double v = gbps(r.measured_s), b = gbps(r.baseline_s);
      emit(o, {fig, n, v, "GB/s", b, b > 0 ? v / b : 0});
      return true;
    };
    Status err;
    {
      auto rl = c.lease(id, LeaseMode::kRead);
      if (!rl) {
        rc = fail_msg("read lease", rl.error());
        break;
      }
      std::byte* a = rl->bytes().data();
      report("ram.read.held", measure_pair(
                                  [&] {
                                    std::memcpy(d, a, n);
                                    return true;
                                  },
                                  baseline, iters, samples));
    }
    {
      auto wl = c.lease(id, LeaseMode::kWrite);
      if (!wl) {
        rc = fail_msg("write lease", wl.error());
        break;
      }
      std::byte* a = wl->bytes().data();
      report("ram.write.held", measure_pair(
                                   [&] {
                                     std::memcpy(a, s, n);
                                     return true;
                                   },
                                   baseline, iters, samples));
    }
    auto cycle = [&](LeaseMode mode) {
      return [&, mode] {
        auto l = c.lease(id, mode);
        if (!l) {
          err = l.error();
          return false;
        }
        if (mode == LeaseMode::kRead) std::memcpy(d, l->bytes().data(), n);
        else std::memcpy(l->bytes().data(), s, n);
        clobber();
        Status st = l->release();
        if (!st.is_ok()) {
          err = st;
          return false;
        }
        return true;
      };
    };
    if (!report("ram.read.lease_cycle", measure_pair(cycle(LeaseMode::kRead), baseline, iters, samples)) ||
        !report("ram.write.lease_cycle", measure_pair(cycle(LeaseMode::kWrite), baseline, iters, samples))) {
      rc = fail_msg("lease cycle", err);
      break;
    }
    if (Status st = c.delete_tensor(pool, name); !st.is_ok()) {
      rc = fail_msg("delete tensor", st);
      break;
    }
  }
  if (Status st = c.drop_pool(pool); !st.is_ok() && rc == 0) rc = fail_msg("drop pool", st);
  return rc;
}

}  // namespace tier::bench
