// tier-bench suites. Each prints one JSON object per line to stdout:
//   {"name":…, "bytes":…, "value":…, "unit":…, "baseline":…, "ratio":…}
// where every figure is measured side by side with its baseline in the same run.
// Each suite returns a process exit code (0 ok, 1 error with a message on stderr).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tier::bench {

struct BenchOptions {
  bool json = false;            // --json: JSON lines only; otherwise also a human table on stderr
  std::string socket;           // --socket: a running tierd; empty = start a private one
  std::string dir;              // --dir: a directory on the NVMe under test (nvme suite)
  int clients = 64;             // --clients (load suite)
  double seconds = 10;          // --seconds (load suite)
  bool quick = false;           // --quick: fewer sizes and repetitions (used by tests)
  uint64_t tensors = 1000000;   // --tensors: tensors in the big pool (catalog suite)
  bool keep = false;            // --keep: leave the catalog suite's pools in place (needs --socket)
  std::vector<uint64_t> sizes;  // --sizes: tensor sizes of the nvme bandwidth figures (empty: default)
  int samples = 0;              // --samples: samples per nvme bandwidth figure (0: default)
  bool only_bandwidth = false;  // --only-bandwidth: nvme spill/fetch figures only, no daemon plan
  std::vector<std::string> stripe_dirs;  // --stripe-dir: more NVMe directories for the engine
  bool no_prepare = false;               // --no-prepare: the engine's data files are fallocate'd only
  bool no_fresh = false;                 // --no-fresh: no nvme.spill.first / nvme.prepare figures
  int64_t flush_behind = -1;             // --flush-behind: the engine's flush_behind_bytes (-1: its default)
  uint32_t queue_depth = 0;              // --queue-depth: the engine's requests in flight (0: its default)
  uint32_t request_size = 0;             // --request-size: the engine's bytes per request (0: its default)
  bool no_ceiling = false;  // --no-ceiling: the engine's figures only, no raw ceiling (baseline 0)
};

// One result line. `bytes` is omitted when unset.
struct Figure {
  std::string name;
  std::optional<uint64_t> bytes;
  double value = 0;
  std::string unit;
  double baseline = 0;
  double ratio = 0;  // value / baseline: throughput targets are >= x, latency targets <= x
};
void emit(const BenchOptions& o, const Figure& f);
// The same, naming which of several candidates the baseline is ("baseline_name").
void emit(const BenchOptions& o, const Figure& f, const std::string& baseline_name);

int run_ram(const BenchOptions& o);
int run_rpc(const BenchOptions& o);
int run_nvme(const BenchOptions& o);
int run_load(const BenchOptions& o);
int run_catalog(const BenchOptions& o);  // not part of "all": minutes at 1M tensors

}  // namespace tier::bench
