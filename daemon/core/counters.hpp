// The daemon's request and tier counters (Status, Metrics), kept by the services that count.
#pragma once

#include <cstdint>

namespace tier::daemon {

struct Counters {
  uint64_t requests = 0, errors = 0;
  uint64_t leases_granted = 0, lease_waits = 0, lease_timeouts = 0;
  uint64_t hits = 0, misses = 0, stalls = 0, evictions = 0, prefetches = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
};

}  // namespace tier::daemon
