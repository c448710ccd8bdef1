// Prometheus text exposition (format 0.0.4) of everything tierd counts: daemon gauges and
// counters, the RAM tier per NUMA node, the NVMe tier per directory, every pool, and a lease
// latency histogram measured in the daemon from the receipt of a Lease request to its reply
// being ready (leases answered at once; leases that had to wait are counted in
// tierd_lease_waits_total instead). Pure formatting: event-loop thread only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/catalog.hpp"
#include "wire/messages.hpp"

namespace tier::daemon {

// A Prometheus label value: backslash, quote and newline escaped (NVMe paths may hold them).
[[nodiscard]] std::string label_escape(const std::string& s);

// Cumulative histogram with fixed upper bounds in microseconds (and +Inf).
class LatencyHistogram {
 public:
  static constexpr std::array<double, 13> kBoundsUs = {5,    10,   25,   50,    100,   250,   500,
                                                       1000, 2500, 5000, 10000, 25000, 100000};
  void observe(uint64_t ns) noexcept {
    double us = static_cast<double>(ns) / 1e3;
    size_t i = 0;
    while (i < kBoundsUs.size() && us > kBoundsUs[i]) ++i;
    counts_[i]++;
    sum_ns_ += ns;
    total_++;
  }
  const std::array<uint64_t, kBoundsUs.size() + 1>& counts() const noexcept { return counts_; }
  uint64_t total() const noexcept { return total_; }
  uint64_t sum_ns() const noexcept { return sum_ns_; }

 private:
  std::array<uint64_t, kBoundsUs.size() + 1> counts_{};
  uint64_t sum_ns_ = 0, total_ = 0;
};

struct MetricsInput {
  const wire::StatusRep* status = nullptr;
  uint64_t lease_waits = 0, lease_timeouts = 0, leases_granted = 0;
  const LatencyHistogram* lease_latency = nullptr;
  Catalog* catalog = nullptr;  // per-pool figures; null: none
  // NVMe I/O per directory (from the NVMe engine; empty without an NVMe tier).
  struct NvmeIo {
    std::string path;
    uint64_t in_flight = 0, queue_depth = 0, bytes_read = 0, bytes_written = 0;
  };
  std::vector<NvmeIo> nvme_io;
  // Per pool: faults in its arenas the SIGBUS guard repaired; empty: not reported.
  std::function<uint64_t(const Pool&)> arena_repairs;
  // Which pools to show (the socket shows a client only the pools it may see); empty: all.
  std::function<bool(const Pool&)> visible;
  // A pool's effective NVMe quota (its stored 0 is the daemon's default); empty: as stored.
  std::function<uint64_t(const Pool&)> nvme_quota;
};

[[nodiscard]] std::string render_metrics(const MetricsInput& in);

// Page `page` of `text`: pieces of at most `max_bytes`, cut after a newline (a line longer than
// that is cut where the page ends). Sets `more` when pages follow.
[[nodiscard]] std::string metrics_page(const std::string& text, uint32_t page, size_t max_bytes, bool& more);

}  // namespace tier::daemon
