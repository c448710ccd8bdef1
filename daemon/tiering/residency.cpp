// NvmeTier: the per-tensor I/O state machine. A fetch brings a tensor's NVMe copy into RAM, a
// write-back (spill) writes its RAM copy to NVMe; their completions update the tensor, its
// TensorIo and the journal, and wait_idle() waits one tensor's I/O out.
#include "tiering/nvme_tier.hpp"

#include <algorithm>
#include <cstring>

#include "base/log.hpp"
#include "tiering/internal.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

using tiering::now_s;
using tiering::nvme_bytes;

Status NvmeTier::start_fetch(Pool& pool, Tensor& t, bool demand, std::optional<Ahead> ahead) {
  TensorIo& s = ts(t.id);
  if (t.ram || s.io == Io::kFetch) return Status::ok();
  // In no tier (discarded, then dropped): there is nothing to read ahead; a lease zero-fills.
  if (!t.nvme && !demand) return Status::ok();
  Result<RamLocation> loc = fail(Code::kResourceExhausted, "");
  if (demand) {
    loc = allocate(pool, t.node, t.size);  // kBusy: retried when I/O completes
  } else {
    // Ahead of use: only clean victims used later than this tensor (or in no plan), no waiting;
    // and never into room above the node's high watermark: maintain() would evict the farthest
    // used tensors again, which a wide plan window fetches again at once (a fetch-evict cycle
    // that kept the device busy and starved a lease until it timed out).
    const NodeUsage* nu = node_usage(t.node);
    const bool over_high = nu && policy::bytes_to_evict(nu->used + t.size, nu->capacity, marks_) > 0;
    if (!over_high) loc = ram_.allocate(pool, t.node, t.size);
    if (over_high || (!loc && loc.error().code() == Code::kResourceExhausted)) {
      auto cands = candidates(std::nullopt, t.node, ahead);
      // Over the pool's quota only its own tensors make room; over the owner's uid_ram_quota
      // only the owner's.
      const bool uid_full = ram_.over_uid_quota(pool, t.size);
      std::erase_if(cands, [&](const policy::Candidate& c) {
        const Tensor* v = catalog_.find_tensor(c.id);
        const Pool* vp = v ? catalog_.find_pool(v->pool_id) : nullptr;
        return !v || !vp || needs_writeback(*v) ||
               (pool.ram_charged() + t.size > pool.ram_quota && v->pool_id != pool.id) ||
               (uid_full && vp->owner_uid != pool.owner_uid);
      });
      uint64_t started = 0;
      Status err;
      if (evict_some(cands, t.size, started, err, pool.id, t.node) > 0)
        loc = ram_.allocate(pool, t.node, t.size);
    }
  }
  TIER_TRY(loc);
  // ensure_registration() may drain I/O, whose completions run: only after it can nobody else
  // have given this tensor RAM or started its I/O (fetches start only here).
  ensure_registration();
  TensorIo& s2 = ts(t.id);
  if (t.ram || s2.io != Io::kNone) {
    ram_.release(pool, *loc);
    return Status::ok();
  }
  std::byte* dst = ram_ptr(*loc);
  if (!dst) {
    ram_.release(pool, *loc);
    return Status(Code::kInternal, "no arena for a fetch");
  }
  if (!t.nvme) {
    std::memset(dst, 0, t.size);
    t.ram = *loc;
    if (durable_) durable_->ram_placed(t);
    t.dirty = true;
    s2.last_use = tick_++;
    stats_.fetches_skipped++;
    progress_ = true;
    return Status::ok();
  }
  s2.io = Io::kFetch;
  s2.pending = *loc;
  s2.error.reset();
  engine_->fetch(*t.nvme, {dst, t.size}, [this, id = t.id](const Status& st) { fetch_done(id, st); });
  (void)s;
  return Status::ok();
}

void NvmeTier::fetch_done(uint64_t id, const Status& st) {
  progress_ = true;
  auto it = ts_.find(id);
  if (it == ts_.end()) return;
  TensorIo& s = it->second;
  s.io = Io::kNone;
  Tensor* t = catalog_.find_tensor(id);
  Pool* p = t ? catalog_.find_pool(t->pool_id) : nullptr;
  if (!t || !p) return;  // forget() waits for I/O, so this does not happen
  if (st) {
    t->ram = s.pending;
    if (durable_) durable_->ram_placed(*t);
    t->dirty = false;
    s.last_use = tick_++;
    stats_.fetches++;
  } else {
    release_ram(*p, s.pending);
    s.error = st;
    stats_.fetch_errors++;
    log_warn("fetch of tensor '{}' (pool '{}') failed: {}", t->name, p->name, st.message());
  }
}

Status NvmeTier::start_spill(Pool& pool, Tensor& t, bool drop_after) {
  ensure_registration();  // before looking at t: it may drain I/O
  TensorIo& s = ts(t.id);
  if (s.io != Io::kNone || !t.ram) return Status(Code::kBusy, "tensor '" + t.name + "' has I/O in flight");
  uint64_t old = t.nvme ? nvme_bytes(*t.nvme) : 0;
  uint64_t need = (t.size + nvme::kExtentAlign - 1) / nvme::kExtentAlign * nvme::kExtentAlign;
  uint64_t quota = nvme_quota(pool);
  uint64_t& spilling = nvme_spilling_[pool.id];
  if (pool.nvme_used - std::min(pool.nvme_used, old) + spilling + need > quota)
    return Status(Code::kResourceExhausted, "pool '" + pool.name + "' NVMe quota of " + format_size(quota) +
                                                " reached (used " + format_size(pool.nvme_used) +
                                                ", being written " + format_size(spilling) + ", need " +
                                                format_size(need) + ")");
  std::byte* src = ram_ptr(*t.ram);
  if (!src) return Status(Code::kInternal, "no arena for a write-back");
  s.io = Io::kSpill;
  s.spill_gen = s.write_gen;
  s.spill_pool = pool.id;
  s.spill_reserved = need;
  spilling += need;
  s.drop_after = drop_after;
  if (drop_after) writeback_pending_bytes_ += t.ram->length;
  engine_->spill(
      t.id, {src, t.size}, [this, id = t.id](Result<nvme::NvmeLocation> r) { spill_done(id, std::move(r)); },
      t.nvme ? &*t.nvme : nullptr);
  return Status::ok();
}

void NvmeTier::spill_done(uint64_t id, Result<nvme::NvmeLocation> r) {
  progress_ = true;
  auto it = ts_.find(id);
  if (it == ts_.end()) return;
  TensorIo& s = it->second;
  s.io = Io::kNone;
  if (auto r = nvme_spilling_.find(s.spill_pool); r != nvme_spilling_.end()) {
    r->second -= std::min(r->second, s.spill_reserved);
    if (r->second == 0) nvme_spilling_.erase(r);
  }
  s.spill_reserved = 0;
  const bool cleaning = std::exchange(s.cleaning, false);
  Tensor* t = catalog_.find_tensor(id);
  Pool* p = t ? catalog_.find_pool(t->pool_id) : nullptr;
  if (!t || !p) return;
  if (s.drop_after && t->ram) writeback_pending_bytes_ -= std::min(writeback_pending_bytes_, t->ram->length);
  if (!r) {
    stats_.writeback_errors++;
    s.spill_failed_at = now_s();
    s.spill_error = r.error();
    last_spill_error_ = r.error();
    log_warn("write-back of tensor '{}' (pool '{}') failed: {}", t->name, p->name, r.error().message());
    return;  // the RAM copy (and any older NVMe copy) stay
  }
  uint64_t old = t->nvme ? nvme_bytes(*t->nvme) : 0;
  p->nvme_used = p->nvme_used - std::min(p->nvme_used, old) + nvme_bytes(*r);
  t->nvme = std::move(*r);
  // Journaled only now that the copy is durable (the engine reports a spill after its writes
  // and an fdatasync of each data file they went to), and only when no write lease was granted
  // while it ran (those bytes may be torn); then the replaced copy is recorded as gone.
  if (durable_) {
    if (s.write_gen == s.spill_gen) durable_->nvme_copy_written(*t, *t->nvme);
    else durable_->nvme_copy_dropped(*t);
  }
  stats_.writebacks++;
  if (cleaning) stats_.cleaned_bytes += t->size;
  s.torn_copy = s.write_gen != s.spill_gen;
  if (!s.torn_copy) t->dirty = false;  // no write lease since it started
  if (s.drop_after && !t->dirty && evictable(*t)) pending_drops_.push_back(t->id);  // flush_drops()
}

void NvmeTier::wait_idle(uint64_t id) {
  for (;;) {
    auto it = ts_.find(id);
    if (it == ts_.end() || it->second.io == Io::kNone || engine_->pending() == 0) return;
    engine_->wait();
    flush_drops();
  }
}

}  // namespace tier::daemon
