// Private to daemon/tiering/: helpers and constants the NvmeTier's files share.
#pragma once

#include <chrono>
#include <cstdint>

#include "core/clock.hpp"
#include "nvme/location.hpp"

namespace tier::daemon::tiering {

// Seconds on the steady clock (the tier's timestamps: plan pace, back-off, prefetch timers).
inline double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// The NVMe bytes a copy holds (its extents, each rounded up to the allocation unit).
inline uint64_t nvme_bytes(const nvme::NvmeLocation& loc) {
  uint64_t b = 0;
  for (const auto& e : loc.extents) b += nvme::allocated_bytes(e);
  return b;
}

// The share of RAM a plan keeps resident when its client gives no budget.
inline constexpr double kDefaultPlanBudget = 0.5;
// A failed write-back (tier full, quota, device error) is not retried for this long, so an
// allocation that cannot evict fails instead of retrying the same victim forever (space
// refusals end earlier: NvmeTier::spill_backed_off).
inline constexpr double kSpillRetryS = 1.0;
// Prefetch lead time beyond the transfer time, as a fraction of it (the device is shared with
// checksum work and other clients).
inline constexpr double kPrefetchMargin = 0.3;

}  // namespace tier::daemon::tiering
