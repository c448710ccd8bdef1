// tier-bench nvme --dir D: the NVMe tier's engine (daemon/tiering/nvme) driven directly, without a
// daemon, against the raw ceiling of the same directory in the same run.
//
//   nvme.spill / nvme.fetch   GB/s for each tensor size (1 MiB .. 1 GiB, --sizes), steady
//                             state: the engine's extents were written before, as a training
//                             job rewrites its tensors step after step. The baseline is the
//                             raw ceiling: the best median of tier-bench's own io_uring loop at
//                             several queue depths and request sizes and of fio with the same
//                             pattern (nvme_raw.hpp); "baseline_name" says which won. Every
//                             transfer is O_DIRECT; fetch includes checksum verification. A
//                             spill counts until the engine reports it, i.e. durable: its
//                             writes and the fdatasync of its data file (the ceiling does not
//                             sync).
//   nvme.spill.first          the first write of a fresh tier: a new engine on an empty
//                             directory, once its start-up preparation is done, vs the ceiling.
//   nvme.prepare              that start-up preparation (the first data file written with
//                             zeros, docs/nvme.md) in GB/s, vs the raw write ceiling.
//   nvme.spill_syncs          fdatasyncs per spilled tensor (group commit shares one per data
//                             file among the spills of a batch); baseline 1, one per tensor.
//   nvme.spill_requests       write requests per spilled tensor; baseline the fewest the
//                             engine's request size allows (--request-size, --queue-depth set
//                             the engine's; tierd's defaults otherwise).
//   nvme.hash                 one thread's extent checksum (XXH3, 8 MiB extents, the engine's
//                             max_extent) over 2 GiB, more than the caches hold, in GB/s per hash
//                             thread; baseline: the same thread reading the same bytes (memchr),
//                             the most any pass over memory gets. It sizes nvme_hash_threads: a
//                             tier moving B GB/s needs about B / this threads.
//   nvme.daemon_plan.*        a cyclic plan over a working set twice the RAM tier, through a
//                             private tierd (--nvme-dir on the same directory) via libtier:
//                             lease, compute, release. tierd's own policy (Belady eviction and
//                             timed prefetch with the plan registered, LRU on demand without)
//                             against the ideal: the bytes any eviction order must move divided
//                             by the raw read bandwidth, with compute equal to that (balanced);
//                             misses and bytes read from tierd's counters; .compute2x with
//                             twice as much compute (full runs only; --only-bandwidth skips them).
//
// --stripe-dir D2 (repeatable) adds directories the engine stripes over; the ceiling stays that
// of --dir alone, so the ratios show how spill and fetch scale with devices.
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "nvme_raw.hpp"
#include "nvme/engine.hpp"
#include "base/log.hpp"
#include "policy/eviction.hpp"
#include "policy/plan.hpp"
#include "suites.hpp"
#include "tier/client.hpp"

namespace tier::bench {
namespace {

using namespace tier::nvme;
namespace pol = tier::policy;

constexpr uint64_t kMiB = 1u << 20;

// Blocks until `fd` is readable or `seconds` pass (sub-millisecond precision).
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<std::byte, FreeDeleter>;

AlignedBuf alloc_filled(uint64_t n, uint64_t seed) {
  AlignedBuf b(static_cast<std::byte*>(std::aligned_alloc(4096, n)));
  if (!b) return b;
  std::mt19937_64 g(seed);
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = g();
    std::memcpy(b.get() + i, &v, 8);
  }
  return b;
}

// Spills `n` bytes as tensors of `size` bytes, all submitted at once (the engine queues them
// behind its queue depth). Returns seconds, or a negative value on error.
double engine_spill(Engine& e, std::byte* src, uint64_t n, uint64_t size, std::vector<NvmeLocation>& locs) {
  locs.assign(n / size, {});
  size_t done = 0;
  bool ok = true;
  double t0 = now_s();
  for (size_t i = 0; i < locs.size(); ++i)
    e.spill(i, {src + i * size, size}, [&, i](Result<NvmeLocation> r) {
      ++done;
      if (!r) {
        std::fprintf(stderr, "tier-bench nvme: %s\n", r.error().to_string().c_str());
        ok = false;
        return;
      }
      locs[i] = std::move(*r);
    });
  while (done < locs.size()) e.wait();
  double t = now_s() - t0;
  return ok ? t : -1;
}

double engine_fetch(Engine& e, std::byte* dst, uint64_t size, const std::vector<NvmeLocation>& locs) {
  size_t done = 0;
  bool ok = true;
  double t0 = now_s();
  for (size_t i = 0; i < locs.size(); ++i)
    e.fetch(locs[i], {dst + i * size, size}, [&](const Status& s) {
      ++done;
      if (!s) {
        std::fprintf(stderr, "tier-bench nvme: %s\n", s.to_string().c_str());
        ok = false;
      }
    });
  while (done < locs.size()) e.wait();
  double t = now_s() - t0;
  return ok ? t : -1;
}

bool free_all(Engine& e, std::vector<NvmeLocation>& locs) {
  for (const auto& l : locs)
    if (Status s = e.free(l); !s) {
      std::fprintf(stderr, "tier-bench nvme: %s\n", s.to_string().c_str());
      return false;
    }
  locs.clear();
  return true;
}

// A counter of DirStats summed over the engine's directories.
uint64_t over_dirs(const Engine& e, uint64_t DirStats::* counter) {
  uint64_t n = 0;
  for (const DirStats& d : e.stats().dirs) n += d.*counter;
  return n;
}

struct Raw {
  double write_bw = 0, read_bw = 0;  // bytes/s, from the last size measured
};

std::vector<uint64_t> bandwidth_sizes(const BenchOptions& o) {
  if (!o.sizes.empty()) return o.sizes;
  if (o.quick) return {1 * kMiB, 16 * kMiB};
  return {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, 1024 * kMiB};
}

// Bytes moved per size and sample: at least one tensor.
uint64_t bytes_for(const BenchOptions& o, uint64_t size) {
  const uint64_t total = o.quick ? 64 * kMiB : 512 * kMiB;
  return std::max(total / size, uint64_t{1}) * size;
}

// This run's folder inside a --stripe-dir (removed at the end, as --dir's is).
std::string stripe_root(const std::string& d) { return d + "/tier-bench-nvme." + std::to_string(::getpid()); }

// `sub`: the engine's folder inside this run's folder of --dir and of each --stripe-dir.
EngineOptions engine_options(const BenchOptions& o, const std::string& dir, const std::string& sub) {
  EngineOptions eo;
  eo.dirs.push_back({dir + "/" + sub, (o.quick ? 512 : 4096) * kMiB, -1});
  for (const std::string& d : o.stripe_dirs)
    eo.dirs.push_back({stripe_root(d).append("/").append(sub), 4096 * kMiB, -1});
  if (o.queue_depth > 0) eo.queue_depth = o.queue_depth;
  if (o.request_size > 0) eo.request_size = o.request_size;
  eo.format = true;
  eo.prepare_files = !o.no_prepare;
  if (o.flush_behind >= 0) eo.flush_behind_bytes = static_cast<uint64_t>(o.flush_behind);
  return eo;
}

// The first write of a fresh tier: a new engine on an empty directory `sub` (what a daemon on a
// new NVMe directory starts with) spills `n` bytes as tensors of `size` at once, once its
// start-up preparation is done. Returns the seconds of the spill, or a negative value on error;
// `startup` gets the seconds from open to prepared and the bytes prepared meanwhile. The files
// stay until the end of the run: removing them on a filesystem mounted with -o discard makes
// the device discard their blocks in the background, which slowed the spills measured after
// it to about 0.6x on the development VM.
struct Startup {
  double seconds = 0;
  uint64_t prepared = 0;
};
double fresh_spill(const BenchOptions& o, const std::string& dir, const std::string& sub, std::byte* src,
                   uint64_t n, uint64_t size, Startup& startup) {
  double t0 = now_s();
  auto e = Engine::open(engine_options(o, dir, sub));
  if (!e) {
    std::fprintf(stderr, "tier-bench nvme: %s\n", e.error().to_string().c_str());
    return -1;
  }
  (*e)->wait_prepared();
  startup.seconds = now_s() - t0;
  startup.prepared = over_dirs(**e, &DirStats::prepared_bytes);
  MemRegion region{src, n};
  (*e)->register_memory({&region, 1});  // as the steady-state engine has its buffers
  std::vector<NvmeLocation> locs;
  double s = engine_spill(**e, src, n, size, locs);
  (*e)->register_memory({});
  return s;
}

// Spill and fetch bandwidth per size, each against the raw ceiling (the best of several raw
// loops and fio, see nvme_raw.hpp), interleaved; then the first write of a fresh tier.
bool bench_bandwidth(const BenchOptions& o, Engine& e, const std::string& dir, Raw& raw) {
  std::vector<uint64_t> sizes = bandwidth_sizes(o);
  const int samples = o.samples > 0 ? o.samples : o.quick ? 1 : 3;
  uint64_t total = 0;
  for (uint64_t size : sizes) total = std::max(total, bytes_for(o, size));
  AlignedBuf src = alloc_filled(total, 1), dst = alloc_filled(total, 2);
  if (!src || !dst) {
    std::fprintf(stderr, "tier-bench nvme: cannot allocate %llu bytes\n", (unsigned long long)total);
    return false;
  }
  MemRegion regions[] = {{src.get(), total}, {dst.get(), total}};
  e.register_memory(regions);  // as the daemon registers its arenas
  RawFile rf;
  if (!o.no_ceiling && !rf.open(dir + "/baseline.raw", total, 64)) return false;
  RawCeiling ceiling(rf, o.quick);
  // The ceiling's samples, or with --no-ceiling none (its figures are then 0).
  auto ceiling_sample = [&](uint64_t n) { return o.no_ceiling || ceiling.sample(src.get(), dst.get(), n); };
  auto ratio = [](double v, double base) { return base > 0 ? v / base : 0.0; };
  std::vector<NvmeLocation> locs;
  // Steady state: the engine's extents have been written before (a training job rewrites the
  // same tensors step after step), as the raw file's blocks have.
  if (engine_spill(e, src.get(), total, std::min<uint64_t>(total, 64 * kMiB), locs) < 0 || !free_all(e, locs))
    return false;
  e.wait_prepared();  // the next data file, prepared while idle, must not overlap the samples
  std::map<uint64_t, double> write_ceiling;
  std::map<uint64_t, std::string> write_winner;
  for (uint64_t size : sizes) {
    uint64_t n = bytes_for(o, size);
    std::vector<double> es, ef;
    ceiling.clear();
    auto syncs = [&e] { return over_dirs(e, &DirStats::syncs); };
    auto requests = [&e] { return over_dirs(e, &DirStats::requests); };
    const uint64_t syncs_before = syncs();
    uint64_t spill_requests = 0;  // the spills' write requests (their syncs are requests too)
    auto spill = [&] {
      const uint64_t r0 = requests(), s0 = syncs();
      double t = engine_spill(e, src.get(), n, size, locs);
      spill_requests += (requests() - r0) - (syncs() - s0);
      return t;
    };
    for (int s = 0; s < samples; ++s) {
      double a, d;
      bool ok;
      if (s % 2 == 0) {
        a = spill();
        ok = ceiling_sample(n);
        d = engine_fetch(e, dst.get(), size, locs);
      } else {
        ok = ceiling_sample(n);
        a = spill();
        d = engine_fetch(e, dst.get(), size, locs);
      }
      if (a < 0 || d < 0 || !ok || !free_all(e, locs)) return false;
      if (std::memcmp(src.get(), dst.get(), n) != 0) {
        std::fprintf(stderr, "tier-bench nvme: fetched bytes differ from the spilled ones\n");
        return false;
      }
      es.push_back(static_cast<double>(n) / a);
      ef.push_back(static_cast<double>(n) / d);
    }
    RawCeiling::Best w = ceiling.best(true), r = ceiling.best(false);
    double vs = median(es), vf = median(ef);
    emit(o, {"nvme.spill", size, vs / 1e9, "GB/s", w.bw / 1e9, ratio(vs, w.bw)}, w.name);
    emit(o, {"nvme.fetch", size, vf / 1e9, "GB/s", r.bw / 1e9, ratio(vf, r.bw)}, r.name);
    const double tensors = static_cast<double>(n) / static_cast<double>(size);  // n: a multiple of size
    double per_tensor = static_cast<double>(syncs() - syncs_before) / (samples * tensors);
    emit(o, {"nvme.spill_syncs", size, per_tensor, "syncs/tensor", 1.0, per_tensor});
    // How the engine split each tensor: write requests per tensor against the fewest its request
    // size allows (more when a tensor spans several extents or a short write was resubmitted).
    const double per_spill = static_cast<double>(spill_requests) / (samples * tensors);
    const uint64_t request = e.stats().dirs.front().request_size;     // what the engine runs with
    const uint64_t fewest_requests = (size + request - 1) / request;  // rounded up
    const auto fewest = static_cast<double>(fewest_requests);
    emit(o, {"nvme.spill_requests", size, per_spill, "requests/tensor", fewest, per_spill / fewest});
    raw.write_bw = w.bw;
    raw.read_bw = r.bw;
    write_ceiling[size] = w.bw;
    write_winner[size] = w.name;
  }
  // The first write of a fresh tier, after every steady-state figure (see fresh_spill).
  std::vector<double> startup_s;
  Startup st;
  for (uint64_t size : o.no_fresh ? std::vector<uint64_t>{} : sizes) {
    uint64_t n = bytes_for(o, size);
    std::vector<double> first;
    for (int s = 0; s < samples; ++s) {
      std::string sub = "fresh-" + std::to_string(size >> 10) + "k-" + std::to_string(s);
      double t = fresh_spill(o, dir, sub, src.get(), n, size, st);
      if (t < 0) return false;
      first.push_back(static_cast<double>(n) / t);
      startup_s.push_back(st.seconds);
    }
    double vfirst = median(first);
    emit(o,
         {"nvme.spill.first", size, vfirst / 1e9, "GB/s", write_ceiling[size] / 1e9,
          ratio(vfirst, write_ceiling[size])},
         write_winner[size]);
  }
  if (st.prepared > 0) {
    // What a fresh tier costs at start-up: one data file per directory written with zeros,
    // whatever the tier's capacity (later files are prepared while the engine is idle).
    double bw = static_cast<double>(st.prepared) / median(startup_s);
    emit(o, {"nvme.prepare", st.prepared, bw / 1e9, "GB/s", raw.write_bw / 1e9, ratio(bw, raw.write_bw)},
         write_winner[sizes.back()]);
  }
  e.register_memory({});  // src and dst are freed next: they must not stay registered
  return true;
}

// nvme.hash: extent_checksum on one thread against a plain read of the same bytes, interleaved
// (measure_pair). The read is glibc's memchr for a byte value the buffer does not hold (its
// SIMD code reads every byte at what one core can pull from memory). The buffer is 2 GiB, more
// than the last-level cache of current server CPUs, as a spill's source may be (--quick: 64 MiB,
// which can be cache-resident).
bool bench_hash(const BenchOptions& o) {
  const uint64_t n = (o.quick ? 64 : 2048) * kMiB, extent = 8 * kMiB;
  AlignedBuf buf = alloc_filled(n, 3);
  if (!buf) {
    std::fprintf(stderr, "tier-bench nvme: cannot allocate %llu bytes\n", (unsigned long long)n);
    return false;
  }
  constexpr std::byte kAbsent{0xff};
  std::replace(buf.get(), buf.get() + n, kAbsent, std::byte{0xfe});
  uint64_t sink = 0;
  auto hash = [&] {
    for (uint64_t off = 0; off < n; off += extent) sink ^= extent_checksum({buf.get() + off, extent});
    return true;
  };
  auto read = [&] { return std::memchr(buf.get(), std::to_integer<int>(kAbsent), n) == nullptr; };
  PairResult r = measure_pair(hash, read, 1, o.quick ? 3 : 7);
  asm volatile("" ::"r"(sink));  // the checksums are used, so the loop cannot be dropped
  if (r.measured_s <= 0 || r.baseline_s <= 0) {
    std::fprintf(stderr, "tier-bench nvme: the checksum rate could not be measured\n");
    return false;
  }
  const double hash_bw = static_cast<double>(n) / r.measured_s,
               read_bw = static_cast<double>(n) / r.baseline_s;
  emit(o, {"nvme.hash", extent, hash_bw / 1e9, "GB/s", read_bw / 1e9, hash_bw / read_bw}, "read");
  return true;
}

// One run of the cyclic plan with room for `slots` of `tensors` tensors in RAM.
// Fewest bytes any eviction order must fetch per step (Belady is optimal for equal sizes):
// simulated on the same plan, steady state.
uint64_t must_move_per_step(size_t tensors, size_t slots, uint64_t size) {
  std::vector<uint64_t> order;
  order.reserve(tensors);
  for (uint64_t i = 0; i < tensors; ++i) order.push_back(i);
  pol::PlanIndex plan(order);
  std::set<uint64_t> cache;
  uint64_t misses = 0;
  const int warm = 2, steps = 4;
  for (uint64_t t = 0; t < (warm + steps) * tensors; ++t) {
    uint64_t x = plan.at(t);
    if (cache.contains(x)) continue;
    if (t >= warm * tensors) ++misses;
    if (cache.size() >= slots) {
      std::vector<pol::Candidate> c;
      c.reserve(cache.size());
      for (uint64_t y : cache) c.push_back(pol::make_candidate(y, size, 0, &plan, t + 1));
      cache.erase(pol::choose_victims(c, size).front());
    }
    cache.insert(x);
  }
  return misses / steps * size;
}

// The cyclic plan through tierd: one lease per use, `compute` seconds of work while it is held.
struct DaemonRun {
  uint64_t misses = 0;      // leases that found their tensor outside RAM (tierd's counter)
  uint64_t bytes_read = 0;  // read from NVMe by tierd in the measured steps
  double wait_s = 0, elapsed_s = 0;
};

bool daemon_cycle(Client& c, const std::string& pool, const std::vector<uint64_t>& ids, int warm, int steps,
                  double compute, DaemonRun& out) {
  auto spin = [](double s) {
    uint64_t end = now_ns() + static_cast<uint64_t>(s * 1e9);
    while (now_ns() < end) clobber();
  };
  uint64_t misses0 = 0, read0 = 0, t0 = 0;
  for (int step = 0; step < warm + steps; ++step) {
    if (step == warm) {
      auto st = c.status();
      if (!st) {
        std::fprintf(stderr, "tier-bench nvme: status: %s\n", st.error().to_string().c_str());
        return false;
      }
      misses0 = st->misses;
      read0 = st->bytes_read;
      t0 = now_ns();
    }
    for (uint64_t id : ids) {
      uint64_t a = now_ns();
      auto l = c.lease(id, LeaseMode::kRead, {LeaseWait::kForever});
      if (!l) {
        std::fprintf(stderr, "tier-bench nvme: lease: %s\n", l.error().to_string().c_str());
        return false;
      }
      if (step >= warm) out.wait_s += static_cast<double>(now_ns() - a) / 1e9;
      spin(compute);
      if (Status st = l->release(); !st) {
        std::fprintf(stderr, "tier-bench nvme: release: %s\n", st.to_string().c_str());
        return false;
      }
    }
  }
  out.elapsed_s = static_cast<double>(now_ns() - t0) / 1e9;
  auto st = c.status();
  if (!st) return false;
  out.misses = st->misses - misses0;
  out.bytes_read = st->bytes_read - read0;
  (void)pool;
  return true;
}

// compute_factor: one step's compute time as a multiple of the ideal I/O time. 1 is the
// balanced, hardest case; 2 leaves the prefetcher room to hide the I/O entirely.
bool bench_daemon_plan(const BenchOptions& o, const std::string& dir, const Raw& raw, double compute_factor,
                       const std::string& suffix) {
  const uint64_t size = o.quick ? 1 * kMiB : 8 * kMiB;
  const uint64_t ram = o.quick ? 16 * kMiB : 128 * kMiB;
  const size_t tensors = 2 * ram / size;
  const int warm = 1, steps = o.quick ? 1 : 3;
  // What stays resident: the RAM tier below its low watermark (0.8).
  const auto slots = static_cast<size_t>(0.8 * static_cast<double>(ram) / static_cast<double>(size));
  uint64_t must = must_move_per_step(tensors, slots, size);
  double ideal_io = static_cast<double>(must) / raw.read_bw;
  double compute = compute_factor * ideal_io / static_cast<double>(tensors);
  double ideal_step = std::max(ideal_io, compute * static_cast<double>(tensors));
  DaemonRun runs[2];
  for (int with_plan = 0; with_plan < 2; ++with_plan) {
    std::string nv = dir;
    nv.append("/daemon").append(suffix).append(std::to_string(with_plan));
    std::error_code ec;
    std::filesystem::create_directories(nv, ec);
    BenchOptions priv = o;
    priv.socket.clear();  // always a private daemon: its RAM tier size is part of the figure
    BenchDaemon d;
    if (!d.start(priv, std::to_string(ram), {"--nvme-dir", nv, "--remove-arenas-on-exit"})) return false;
    auto c = Client::connect(d.socket(), {.client_name = "tier-bench"});
    if (!c) {
      std::fprintf(stderr, "tier-bench nvme: connect: %s\n", c.error().to_string().c_str());
      return false;
    }
    std::string pool = bench_pool_name("nvme");
    if (auto p = (*c)->create_pool(pool); !p) {
      std::fprintf(stderr, "tier-bench nvme: create pool: %s\n", p.error().to_string().c_str());
      return false;
    }
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < tensors; ++i) {
      TensorDesc td;
      td.name = "t" + std::to_string(i);
      td.size = size;
      auto t = (*c)->create_tensor(pool, td);
      if (!t) {
        std::fprintf(stderr, "tier-bench nvme: create: %s\n", t.error().to_string().c_str());
        return false;
      }
      ids.push_back(t->id);
      auto l = (*c)->lease(t->id, LeaseMode::kWrite, {LeaseWait::kForever});
      if (!l) {
        std::fprintf(stderr, "tier-bench nvme: lease: %s\n", l.error().to_string().c_str());
        return false;
      }
      std::memset(l->bytes().data(), static_cast<int>(i), size);
      if (Status st = l->release(); !st) {
        std::fprintf(stderr, "tier-bench nvme: release: %s\n", st.to_string().c_str());
        return false;
      }
    }
    if (with_plan) {
      if (Status st = (*c)->set_plan(pool, ids, slots * size); !st) {
        std::fprintf(stderr, "tier-bench nvme: set_plan: %s\n", st.to_string().c_str());
        return false;
      }
    }
    if (!daemon_cycle(**c, pool, ids, warm, steps, compute, runs[with_plan])) return false;
  }
  const DaemonRun& lru = runs[0];
  const DaemonRun& plan = runs[1];
  double n = steps;
  uint64_t set = tensors * size;
  auto name = [&](const char* base) { return std::string("nvme.daemon_plan.") + base + suffix; };
  emit(o, {name("misses"), set, plan.misses / n, "misses/step", lru.misses / n,
           lru.misses ? static_cast<double>(plan.misses) / static_cast<double>(lru.misses) : 0});
  emit(o, {name("stall"), set, plan.wait_s / n * 1e3, "ms/step", lru.wait_s / n * 1e3,
           lru.wait_s > 0 ? plan.wait_s / lru.wait_s : 0});
  emit(o, {name("moved"), set, static_cast<double>(plan.bytes_read) / n / kMiB, "MiB/step",
           static_cast<double>(must) / kMiB,
           static_cast<double>(plan.bytes_read) / n / static_cast<double>(must)});
  emit(o, {name("step"), set, plan.elapsed_s / n * 1e3, "ms", ideal_step * 1e3,
           plan.elapsed_s / n / ideal_step});
  emit(o, {name("lru_step"), set, lru.elapsed_s / n * 1e3, "ms", ideal_step * 1e3,
           lru.elapsed_s / n / ideal_step});
  return true;
}

}  // namespace

int run_nvme(const BenchOptions& o) {
  if (o.dir.empty()) {
    std::fprintf(stderr, "tier-bench nvme: --dir D is required (a directory on the device under test)\n");
    return 1;
  }
  std::string dir = o.dir + "/tier-bench-nvme." + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "tier-bench nvme: create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  if (o.json) set_log_level(LogLevel::kWarning);
  int rc = 1;
  {
    auto e = Engine::open(engine_options(o, dir, "engine"));
    if (!e) {
      std::fprintf(stderr, "tier-bench nvme: %s\n", e.error().to_string().c_str());
    } else if ((*e)->stats().dirs[0].backend != "io_uring") {
      std::fprintf(stderr, "tier-bench nvme: %s does not support io_uring + O_DIRECT; nothing to compare\n",
                   o.dir.c_str());
    } else {
      Raw raw;
      if (bench_bandwidth(o, **e, dir, raw) &&
          (o.only_bandwidth ||
           (bench_hash(o) && (bench_daemon_plan(o, dir, raw, 1.0, "") &&
                              (o.quick || bench_daemon_plan(o, dir, raw, 2.0, ".compute2x"))))))
        rc = 0;
    }
  }
  std::filesystem::remove_all(dir, ec);
  for (const std::string& d : o.stripe_dirs) std::filesystem::remove_all(stripe_root(d), ec);
  return rc;
}

}  // namespace tier::bench
