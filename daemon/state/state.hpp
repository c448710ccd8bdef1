// Everything the request handler serves from: configuration, topology, catalog, RAM tier,
// lease table and counters. One per daemon, owned by main (or by a test), used only on the
// event loop thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/catalog.hpp"
#include "durability/durability.hpp"
#include "core/config.hpp"
#include "leases/reclaim.hpp"
#include "leases/lease_table.hpp"
#include "ram/ram_tier.hpp"
#include "tiering/nvme_tier.hpp"
#include "core/topology.hpp"

namespace tier::daemon {

inline constexpr const char* kDaemonVersion = "0.1.0";

struct Counters {
  uint64_t requests = 0, errors = 0;
  uint64_t leases_granted = 0, lease_waits = 0, lease_timeouts = 0;
  uint64_t hits = 0, misses = 0, stalls = 0, evictions = 0, prefetches = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
};

struct DaemonState {
  Config config;
  ResolvedSizes sizes;
  Topology topology;
  Catalog catalog;
  std::unique_ptr<RamTier> ram;
  LeaseTable leases;
  ReclaimTable reclaims;  // write leases held across a restart, until reclaimed or lost
  Counters counters;
  Clock::time_point started = Clock::now();
  gid_t admin_gid = static_cast<gid_t>(-1);  // from config admin_group; -1: none
  uint32_t clients = 0;                      // sessions open now (the server keeps it)
  // The journal, recovery and snapshots (open_durability, after make_state); null in tests
  // that build a state without a state dir of their own.
  std::unique_ptr<Durability> durable;
  // The NVMe tier; null without NVMe directories. Declared last: destroyed (its I/O drained)
  // while the catalog and RAM tier still exist.
  std::unique_ptr<NvmeTier> tiering;
};

// Builds the state from a validated config and sizes: loads the topology and sets up the
// RAM tier. Errors name what failed.
[[nodiscard]] Result<std::unique_ptr<DaemonState>> make_state(Config cfg, ResolvedSizes sizes);

// Opens the journal in the state dir for `st` (daemon/durability.hpp): rebuilds its catalog
// and RAM tier, keeps the write leases held across a restart for their holders, makes what
// the rebuild journaled durable, and routes the NVMe tier's residency reports to it.
[[nodiscard]] Status open_durability(DaemonState& st, RecoveryReport* report = nullptr);

}  // namespace tier::daemon
