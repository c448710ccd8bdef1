// NvmeTier: watermark maintenance and background write-back of dirty, idle RAM copies while
// the device would otherwise idle.
#include "tiering/nvme_tier.hpp"

#include <algorithm>

#include "base/log.hpp"
#include "tiering/internal.hpp"

namespace tier::daemon {

using tiering::now_s;

void NvmeTier::maintain() {
  for (const auto& n : ram_.nodes()) {
    uint64_t over = policy::bytes_to_evict(n.used, n.capacity, marks_);
    if (over <= writeback_pending_bytes_) continue;
    auto cands = candidates(std::nullopt, n.node, std::nullopt);
    uint64_t started = writeback_pending_bytes_;
    Status err;
    evict_some(cands, over, started, err);
  }
}

void NvmeTier::clean_ahead() {
  if (dirty_background_ >= 1.0 || plans_.empty() || engine_->pending() != 0) return;
  // The scan walks every plan (up to max_plan_uses each): after a completion it runs at once
  // (the device just went idle), otherwise at most every 2 ms, so a loop busy with leases
  // spends little on it.
  const double now = now_s();
  if (!progress_ && now < next_clean_scan_) {
    if (!std::isfinite(clean_due_)) {  // look again then, even if nothing else happens
      clean_due_ = next_clean_scan_;
      arm_timer();
    }
    return;
  }
  next_clean_scan_ = now + 0.002;
  clean_due_ = std::numeric_limits<double>::infinity();
  // Only tensors a plan reads later: their bytes are live and must reach NVMe before their RAM
  // can be reused, and the plan says when they are needed. A tensor overwritten next (or in no
  // plan) may never need the write, so it is left to eviction.
  // The limit is a fraction of the node's RAM tier and of the pool's RAM quota, whichever
  // binds: a pool far below the node's capacity still evicts when it reaches its quota.
  std::unordered_map<int32_t, uint64_t> node_dirty;  // planned, live, dirty bytes in RAM
  std::unordered_map<uint64_t, uint64_t> pool_dirty;
  struct Cand {
    Tensor* t;
    Pool* pool;
    uint64_t next;
  };
  std::vector<Cand> cands;
  std::unordered_set<uint64_t> seen;
  for (const auto& [sid, pl] : plans_) {
    Pool* pool = catalog_.find_pool(pl.pool_id);
    if (!pool) continue;
    const std::vector<policy::PlanAt> plans = plans_for_pool(pool->id);
    for (uint64_t id : pl.index.order()) {
      if (!seen.insert(id).second) continue;
      Tensor* t = catalog_.find_tensor(id);
      if (!t || !t->ram || !needs_writeback(*t)) continue;
      policy::Candidate c = policy::make_candidate(id, t->ram->length, 0, plans);
      if (!c.next_use) continue;
      node_dirty[t->ram->node] += t->ram->length;
      pool_dirty[pool->id] += t->ram->length;
      if (evictable(*t) && !spill_backed_off(ts(id), now)) cands.push_back({t, pool, *c.next_use});
    }
  }
  std::unordered_map<int32_t, uint64_t> node_capacity;
  for (const auto& n : ram_.nodes()) node_capacity[n.node] = n.capacity;
  auto over = [&](uint64_t bytes, uint64_t limit) {
    return limit > 0 && static_cast<double>(bytes) > dirty_background_ * static_cast<double>(limit);
  };
  const Cand* pick = nullptr;
  for (const Cand& c : cands)
    if ((over(node_dirty[c.t->ram->node], node_capacity[c.t->ram->node]) ||
         over(pool_dirty[c.pool->id], c.pool->ram_quota)) &&
        (!pick || c.next > pick->next))
      pick = &c;
  if (!pick) return;
  if (Status st = start_spill(*pick->pool, *pick->t, /*drop_after=*/false); !st) {
    TensorIo& s = ts(pick->t->id);  // e.g. the NVMe quota is full: not retried for a while
    s.spill_failed_at = now;
    s.spill_error = st;
    return;
  }
  ts(pick->t->id).cleaning = true;  // counted in cleaned_bytes once durable; one at a time
}

}  // namespace tier::daemon
