// Everything the request handler serves from: configuration, topology, catalog, RAM tier,
// lease table and counters. One per daemon, owned by main (or by a test), used only on the
// event loop thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/catalog.hpp"
#include "core/counters.hpp"
#include "durability/durability.hpp"
#include "core/config.hpp"
#include "leases/lease_service.hpp"
#include "leases/reclaim.hpp"
#include "pools/pool_service.hpp"
#include "leases/lease_table.hpp"
#include "ram/ram_tier.hpp"
#include "tiering/nvme_tier.hpp"
#include "core/topology.hpp"

namespace tier::daemon {

inline constexpr const char* kDaemonVersion = "0.1.0";

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

  // The parts each service works on (they never see the whole state).
  [[nodiscard]] ReclaimTable::Parts reclaim_parts() {
    return {catalog, leases, ram.get(), config.lease_reclaim_timeout_ms};
  }
  [[nodiscard]] LeaseService::Parts lease_parts() {
    return {config, catalog, leases, reclaims, counters, admin_gid, ram, durable, tiering};
  }
  [[nodiscard]] PoolService::Parts pool_parts() {
    return {config, sizes, topology, catalog, ram, durable, tiering};
  }
};

}  // namespace tier::daemon
