// NvmeTier: step plans and prefetch. Registered plans, the timer that starts each prefetch
// just in time, and the Prefetch request.
#include "tiering/nvme_tier.hpp"

#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/log.hpp"
#include "tiering/internal.hpp"
#include "policy/prefetch.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

using tiering::kDefaultPlanBudget;
using tiering::kPrefetchMargin;
using tiering::now_s;

Status NvmeTier::set_plan(uint64_t session, Pool& pool, std::vector<uint64_t> ids, uint64_t budget,
                          std::vector<uint8_t> overwrite) {
  if (ids.empty()) {
    plans_.erase(session);
    return Status::ok();
  }
  Plan pl;
  pl.pool_id = pool.id;
  pl.index = policy::PlanIndex(std::move(ids), std::move(overwrite));
  pl.budget =
      budget != 0
          ? budget
          : static_cast<uint64_t>(static_cast<double>(ram_.capacity()) * marks_.low * kDefaultPlanBudget);
  plans_[session] = std::move(pl);
  next_prefetch_ = 0;
  return Status::ok();
}

void NvmeTier::session_closed(uint64_t session) { plans_.erase(session); }

void NvmeTier::schedule_prefetch() {
  double now = now_s();
  double next = std::numeric_limits<double>::infinity();
  double bw = engine_->measured_bandwidth();
  if (bw <= 0) bw = 1e9;
  for (auto& [sid, pl] : plans_) {
    Pool* pool = catalog_.find_pool(pl.pool_id);
    if (!pool) continue;
    policy::PrefetchInput in;
    in.plan = &pl.index;
    in.cursor = pl.cursor;
    in.present = [&](uint64_t id) {
      Tensor* t = catalog_.find_tensor(id);
      if (!t) return true;  // deleted: nothing to fetch
      auto it = ts_.find(id);
      // In no tier: nothing to read (a lease zero-fills it).
      return t->ram.has_value() || !t->nvme || (it != ts_.end() && it->second.io == Io::kFetch);
    };
    in.bytes_of = [&](uint64_t id) {
      Tensor* t = catalog_.find_tensor(id);
      return t ? t->size : uint64_t{0};
    };
    in.budget_bytes = pl.budget;
    in.ahead_bytes = std::max<uint64_t>(pl.budget / 4, 1);
    in.bandwidth = bw;
    in.seconds_per_use = pl.seconds_per_use;
    in.now = now;
    if (pl.last_advance > 0) in.cursor_at = pl.last_advance + pl.seconds_per_use;
    in.margin = kPrefetchMargin;
    policy::PrefetchPlan pp = policy::plan_prefetch(in);
    for (const auto& item : pp.items) {
      if (item.start_at > now) continue;
      Tensor* t = catalog_.find_tensor(item.id);
      if (!t || t->pool_id != pool->id) continue;
      Status st = start_fetch(*pool, *t, false, Ahead{item.distance, pl.seconds_per_use});
      if (st) {
        if (ts(t->id).io == Io::kFetch) stats_.prefetches++;
      } else {
        break;  // no clean room now: try again when something completes
      }
    }
    next = std::min(next, pp.next_start);
  }
  next_prefetch_ = next;
  arm_timer();
}

void NvmeTier::arm_timer() {
  const double next = std::min(next_prefetch_, clean_due_);
  itimerspec its{};
  if (std::isfinite(next)) {
    double at = std::max(next, now_s() + 1e-4);
    its.it_value.tv_sec = static_cast<time_t>(at);
    its.it_value.tv_nsec = static_cast<long>((at - std::floor(at)) * 1e9);
  }
  ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

Status NvmeTier::prefetch(Pool& pool, std::span<Tensor* const> tensors) {
  for (Tensor* t : tensors) {
    if (t->ram || !t->nvme || ts(t->id).io == Io::kFetch) continue;
    // A hint: no room without waiting for write-backs (kBusy) skips this tensor.
    Status st = start_fetch(pool, *t, true, std::nullopt);
    if (!st && st.code() == Code::kBusy) continue;
    TIER_TRY(st);
    stats_.prefetches++;
  }
  return Status::ok();
}

}  // namespace tier::daemon
