// Shared helpers of the tier-bench suites: timing, interleaved side-by-side measurement, and
// the private tierd a suite starts when no --socket is given.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "suites.hpp"

namespace tier::bench {

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Keeps the compiler from dropping or reordering the copies around the clock reads.
inline void clobber() { asm volatile("" ::: "memory"); }

// Runs `measured` and `baseline` as interleaved samples (A B, then B A, ...) so drift in clock
// speed or background load hits both alike; each sample calls its function `iters` times.
// Returns the best (lowest), over samples, of the mean seconds per call, for each: on a shared
// machine, background load only ever slows a sample down, so the best sample of each side is the
// least disturbed estimate, and both sides get the same treatment. A function that returns
// false aborts the measurement (the result is then {-1, -1}).
struct PairResult {
  double measured_s = -1, baseline_s = -1;
};
PairResult measure_pair(const std::function<bool()>& measured, const std::function<bool()>& baseline,
                        int iters, int samples);

// The tierd a suite talks to: the one at --socket, or a private one started from the tierd
// binary next to tier-bench (fork/exec, temporary socket and state dir, stopped with SIGTERM
// when this object goes away).
class BenchDaemon {
 public:
  BenchDaemon() = default;
  ~BenchDaemon();
  BenchDaemon(const BenchDaemon&) = delete;
  BenchDaemon& operator=(const BenchDaemon&) = delete;

  // Uses o.socket when set; otherwise starts a private daemon with `ram` (a tierd --ram value).
  // Returns false (with a message on stderr) when that fails.
  bool start(const BenchOptions& o, const std::string& ram);
  // The same with extra tierd arguments for the private daemon (e.g. --nvme-dir D).
  bool start(const BenchOptions& o, const std::string& ram, const std::vector<std::string>& extra);
  const std::string& socket() const { return socket_; }
  bool is_private() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }  // the private daemon's pid, -1 for --socket

 private:
  void stop();
  std::string socket_, dir_;
  pid_t pid_ = -1;
};

// CPU placement. pin: one thread (0 = the caller) to `cpu`; pin_process: every thread of
// `pid`; allowed_cpus: the caller's affinity mask as a list; unpin_self: restore that list.
bool pin(pid_t tid, int cpu);
bool pin_process(pid_t pid, int cpu);
std::vector<int> allowed_cpus();
void unpin_self(const std::vector<int>& cpus);

// A pool name private to this process, so runs against a shared daemon do not collide.
std::string bench_pool_name(const char* suite);

// tierd's pid through SO_PEERCRED of a fresh connection to `socket_path`; -1 when unreachable.
pid_t daemon_pid(const std::string& socket_path);
// A "Key:   N kB" field of /proc/<pid>/status (e.g. "VmRSS") in KiB; -1 when unreadable.
double proc_status_kib(pid_t pid, const char* key);
// The q-quantile (0..1) of `v` by nth_element (reorders v).
double quantile(std::vector<double>& v, double q);

}  // namespace tier::bench
