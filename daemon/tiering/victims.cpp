// NvmeTier: choosing what leaves RAM. Candidates in policy order (daemon/tiering/policy/eviction.hpp),
// evicting them until an allocation fits, and the Evict request.
#include "tiering/nvme_tier.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tiering/admission.hpp"
#include "base/log.hpp"
#include "tiering/internal.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

using tiering::kSpillRetryS;
using tiering::now_s;
using tiering::nvme_bytes;

std::vector<policy::PlanAt> NvmeTier::plans_for_pool(uint64_t pool_id) const {
  std::vector<policy::PlanAt> out;
  for (const auto& [sid, p] : plans_)
    if (p.pool_id == pool_id) out.push_back({&p.index, p.cursor, p.seconds_per_use});
  return out;
}

std::vector<policy::Candidate> NvmeTier::candidates(std::optional<uint64_t> pool, std::optional<int32_t> node,
                                                    std::optional<Ahead> protect) {
  std::vector<policy::Candidate> out;
  // Several clients (a trainer's pass and its optimizer thread, or several ranks on the node)
  // may each have a plan over the pool: a tensor's next use is the nearest in any of them.
  auto add_pool = [&](Pool& p) {
    const std::vector<policy::PlanAt> plans = plans_for_pool(p.id);
    std::optional<uint64_t> limit;
    if (protect)
      limit = policy::distance_key({nullptr, 0, protect->seconds_per_use}, protect->uses,
                                   policy::timed_distances(plans));
    for (auto& [id, t] : p.tensors) {
      if (!evictable(t) || (node && t.ram->node != *node)) continue;
      policy::Candidate c = policy::make_candidate(id, t.ram->length, ts(id).last_use, plans);
      c.dirty = needs_writeback(t);
      if (auto it = ts_.find(id); it != ts_.end()) c.discarded_before = it->second.discarded_before;
      if (limit && c.next_use && *c.next_use <= *limit) continue;
      out.push_back(c);
    }
  };
  if (pool) {
    if (Pool* p = catalog_.find_pool(*pool)) add_pool(*p);
  } else {
    for (const auto& [name, pid] : catalog_.pool_names())
      if (Pool* p = catalog_.find_pool(pid)) add_pool(*p);
  }
  return out;
}

std::vector<policy::Candidate> NvmeTier::candidates_of_uid(uid_t uid) {
  std::vector<policy::Candidate> out;
  for (const auto& [name, pid] : catalog_.pool_names()) {
    const Pool* p = catalog_.find_pool(pid);
    if (!p || p->owner_uid != uid) continue;
    std::vector<policy::Candidate> c = candidates(pid, std::nullopt, std::nullopt);
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

bool NvmeTier::spill_backed_off(const TensorIo& s, double now) const {
  if (now - s.spill_failed_at >= kSpillRetryS) return false;
  return !(s.spill_error.code() == Code::kResourceExhausted && nvme_freed_at_ >= s.spill_failed_at);
}

std::string NvmeTier::nvme_short_message(const NvmeShort& sh) const {
  if (const Pool* p = sh.quota_pool) {
    const uint64_t q = nvme_quota(*p);
    return fmt::format("pool '{}' NVMe quota full: {} of {} free, {} needed for the victims' write-backs",
                       p->name, format_size(q - std::min(q, p->nvme_used)), format_size(q),
                       format_size(sh.bytes));
  }
  const nvme::EngineStats es = engine_->stats();
  return fmt::format("NVMe tier full: {} free, {} needed for the victims' write-backs",
                     format_size(es.capacity - std::min(es.capacity, es.used)), format_size(sh.bytes));
}

uint64_t NvmeTier::evict_some(std::span<const policy::Candidate> cands, uint64_t need, uint64_t& started,
                              Status& last_error, std::optional<uint64_t> for_pool, int32_t for_node,
                              NvmeShort* short_of) {
  uint64_t freed = 0;
  std::vector<Tensor*> clean;  // dropped together below: one journal commit
  // A victim whose write-back NVMe space refused goes into *short_of, until such victims would
  // have freed `need`: what this allocation lacks.
  auto space_refused = [&](const Tensor& t, const Pool& p, const Status& st) {
    if (!short_of || st.code() != Code::kResourceExhausted || short_of->ram_bytes >= need) return;
    const uint64_t n = round_up_checked(t.size, nvme::kExtentAlign).value_or(t.size);
    short_of->bytes += n;
    short_of->ram_bytes += t.ram->length;
    // The pool's quota, when it is below the tier (a default quota is the whole tier).
    const uint64_t old = t.nvme ? nvme_bytes(*t.nvme) : 0;
    if (nvme_quota(p) < nvme_capacity_ && p.nvme_used - std::min(p.nvme_used, old) + n > nvme_quota(p))
      short_of->quota_pool = &p;
  };
  for (uint64_t id : policy::eviction_order(cands)) {
    if (freed + started >= need) break;
    Tensor* t = catalog_.find_tensor(id);
    Pool* p = t ? catalog_.find_pool(t->pool_id) : nullptr;
    if (!p || !evictable(*t)) continue;
    if (needs_writeback(*t) && spill_backed_off(ts(id), now_s())) {
      last_error = ts(id).spill_error;
      space_refused(*t, *p, last_error);
      continue;
    }
    uint64_t len = t->ram->length;
    ts(id).keep_pages = for_pool && *for_pool == t->pool_id && for_node == t->ram->node;
    if (!needs_writeback(*t)) {
      clean.push_back(t);
      freed += len;
    } else if (Status st = start_spill(*p, *t, true); st) {
      started += len;
    } else {
      last_error = st;
      ts(id).spill_failed_at = now_s();
      ts(id).spill_error = st;
      space_refused(*t, *p, st);
    }
  }
  drop_ram_many(clean);
  return freed;
}

Result<RamLocation> NvmeTier::allocate(Pool& pool, int32_t node, uint64_t size) {
  // A size no eviction can make room for (a tensor journaled before admission checked it):
  // refused without evicting anything.
  TIER_TRY(ram_admits(ram_, pool, node, size, ""));
  Status last_error;
  NvmeShort short_of;
  last_spill_error_ = Status::ok();
  bool compacted = false;
  for (;;) {
    auto loc = ram_.allocate(pool, node, size, compacted);
    if (loc) {
      maintain();
      return loc;
    }
    if (loc.error().code() != Code::kResourceExhausted) return loc;
    // What limits it: the pool's quota (evict its tensors anywhere), the node (anyone's on the
    // node), else fragmentation of the pool's arena on the node (its tensors there).
    uint64_t gran = 4096;
    uint64_t need = (size + gran - 1) / gran * gran;
    std::optional<uint64_t> in_pool;
    std::optional<int32_t> on_node;
    const NodeUsage* nu = node_usage(node);
    const bool uid_full = pool.ram_charged() + need <= pool.ram_quota && ram_.over_uid_quota(pool, need);
    if (pool.ram_charged() + need > pool.ram_quota) {
      in_pool = pool.id;
    } else if (uid_full) {
      // The owner's uid_ram_quota: its own tensors leave RAM (any pool, any node), nobody else's.
    } else if (nu && nu->charged() + need > nu->capacity) {
      on_node = node;
    } else {
      in_pool = pool.id;
      on_node = node;
    }
    auto cands = uid_full ? candidates_of_uid(pool.owner_uid) : candidates(in_pool, on_node, std::nullopt);
    uint64_t started = 0;
    short_of = {};
    uint64_t freed = evict_some(cands, need, started, last_error, pool.id, node, &short_of);
    if (freed > 0) continue;
    if (engine_->pending() > 0) return fail(Code::kBusy, "RAM is being freed by write-backs");
    // Room enough but in pieces, and nothing more can leave RAM: move tensors together.
    if (in_pool && on_node && !compacted && compact(pool, node, size)) {
      compacted = true;  // once: a range it made that still does not serve is not fragmentation
      continue;
    }
    // Say what is really short: NVMe space for the victims' write-backs, a failing device, or
    // evictable tensors (the rest leased or pinned).
    std::string why = loc.error().message();
    if (last_error.is_ok()) last_error = last_spill_error_;
    if (short_of.bytes > 0) why += "; " + nvme_short_message(short_of);
    else if (!last_error.is_ok()) why += "; writing back its victims failed: " + last_error.message();
    else why += "; nothing more can be evicted (the rest is leased or pinned by waiting leases)";
    return fail(Code::kResourceExhausted, why);
  }
}

Status NvmeTier::evict(Pool& pool, std::span<Tensor* const> tensors, size_t& skipped) {
  skipped = 0;
  std::vector<Tensor*> spilling, clean;
  for (Tensor* t : tensors) {
    wait_idle(t->id);
    if (!t->ram) continue;
    if (t->readers > 0 || t->writer) {
      ++skipped;
      continue;
    }
    if (!needs_writeback(*t)) {
      clean.push_back(t);
      continue;
    }
    if (Status st = start_spill(pool, *t, false); !st) {
      drop_ram_many(clean);
      return st;
    }
    spilling.push_back(t);
  }
  drop_ram_many(clean);
  clean.clear();
  Status first;
  for (Tensor* t : spilling) {
    wait_idle(t->id);
    if (!t->ram) continue;
    if (needs_writeback(*t)) {
      if (first.is_ok())
        first = Status(Code::kIo,
                       "write-back of tensor '" + t->name + "' failed (see the daemon log); it stays in RAM");
      if (t->readers == 0 && !t->writer) continue;
    }
    if (t->readers > 0 || t->writer) {
      ++skipped;
      continue;
    }
    clean.push_back(t);
  }
  drop_ram_many(clean);
  return first;
}

}  // namespace tier::daemon
