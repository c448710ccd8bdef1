// Prefetch scheduling: which tensors of the plan to bring back from NVMe, and when to start
// each so it arrives just before its use, not long before (so it does not crowd the RAM budget
// earlier than needed).
//
// Model: the plan's uses happen every `seconds_per_use` (measured: the mean time between cursor
// advances), the use at the cursor being due at `cursor_at` (when the cursor got there plus one
// interval; defaults to `now`). The device moves `bandwidth` bytes/s
// and serves fetches one after another in use order. The look-ahead window is the upcoming uses
// (at most one step) whose distinct tensors fit in `budget_bytes`, and whose missing tensors
// fit in `ahead_bytes`. For each tensor in the window
// that is not resident (nor already in flight), the latest start is computed backwards from the
// last one: finish_i = min(use_i, start_{i+1}), start_i = finish_i - bytes_i / bandwidth
// (times `1 + margin`). A start at or before `now` means "issue now"; a start before `now`
// also means it will arrive late (a stall of about now - start). The daemon re-plans whenever
// the cursor moves, a fetch completes, or `next_start` passes.
//
// Pure logic: no I/O, no clock reads (the caller passes `now`).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "policy/plan.hpp"

namespace tier::policy {

struct PrefetchInput {
  const PlanIndex* plan = nullptr;
  uint64_t cursor = 0;
  std::function<bool(uint64_t id)> present;       // resident in RAM or being fetched now
  std::function<uint64_t(uint64_t id)> bytes_of;  // tensor size
  uint64_t budget_bytes = 0;                      // bytes of the upcoming plan that may be held in RAM
  uint64_t ahead_bytes = 0;         // at most this many missing bytes in the window (0: no limit):
                                    // bounds the RAM that prefetched, not yet used tensors take
  double bandwidth = 1e9;           // bytes/s the device delivers (measured)
  double seconds_per_use = 0;       // measured mean time between plan uses
  double now = 0;                   // seconds, the caller's clock
  std::optional<double> cursor_at;  // when the use at the cursor is due; unset = now
  double margin = 0.05;             // extra lead time as a fraction of each transfer time
};

struct PrefetchItem {
  uint64_t id = 0;
  uint64_t bytes = 0;
  uint64_t distance = 0;  // uses from the cursor to its use
  double use_at = 0;      // when it is needed
  double start_at = 0;    // latest start that still lets it (and later ones) arrive in time
  double finish_at = 0;   // start_at + transfer time
  bool late = false;      // start_at < now: it cannot arrive before its use
};

struct PrefetchPlan {
  std::vector<PrefetchItem> items;  // missing tensors in the window, in use order
  std::vector<uint64_t> start_now;  // ids to issue now (start_at <= now), in use order
  double next_start = 0;            // earliest start_at after now (infinity when none)
  uint64_t window_uses = 0;         // uses covered by the window
  uint64_t window_bytes = 0;        // distinct bytes in the window
};

PrefetchPlan plan_prefetch(const PrefetchInput& in);

}  // namespace tier::policy
