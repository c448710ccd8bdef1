// NvmeTier: what a lease needs from the tier. Fetches before a grant, RAM without a read for
// overwrites, LRU stamps and dirtiness at the grant, Discard hints and a restore's placement.
#include "tiering/nvme_tier.hpp"

#include <algorithm>
#include <cstring>

#include "base/log.hpp"
#include "tiering/internal.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

using tiering::now_s;

bool NvmeTier::may_place_for_overwrite(std::span<Tensor* const> tensors, LeaseMode mode) {
  // A placed tensor holds unspecified bytes and is not leased yet: anyone could read them until
  // the grant. So place only when the grant follows at once, i.e. no tensor of the lease is
  // still being fetched (the caller has checked that no conflicting lease is held).
  if (mode != LeaseMode::kOverwrite) return false;
  for (const Tensor* t : tensors) {
    auto it = ts_.find(t->id);
    if (!t->ram && it != ts_.end() && it->second.io == Io::kFetch) return false;
  }
  return true;
}

Status NvmeTier::place_for_overwrite(std::span<Tensor* const> tensors) {
  // All or none: a tensor placed while another waits for room would sit unleased with
  // unspecified bytes. The extents found so far are not tensors yet, so no eviction below
  // can take them; the lease's own tensors are in leasing_.
  std::vector<std::pair<Tensor*, RamLocation>> got;
  auto undo = [&] {
    for (auto& [u, loc] : got)
      if (Pool* up = catalog_.find_pool(u->pool_id)) ram_.release(*up, loc);
  };
  for (Tensor* t : tensors) {
    if (t->ram || ts(t->id).io != Io::kNone) continue;
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p) {
      undo();
      return Status(Code::kInternal, "tensor without a pool");
    }
    auto loc = allocate(*p, t->node, t->size);
    if (!loc) {
      undo();
      return loc.error();  // kBusy: write-backs are freeing RAM; retried when they complete
    }
    got.emplace_back(t, *loc);
  }
  for (auto& [t, loc] : got) {
    t->ram = loc;
    if (durable_) durable_->ram_placed(*t);
    t->dirty = true;
    ts(t->id).last_use = tick_++;
    stats_.fetches_skipped++;
  }
  return Status::ok();
}

Result<bool> NvmeTier::prepare_lease(uint64_t session, std::span<Tensor* const> tensors, LeaseMode mode) {
  // A grant follows at once when this returns false: the fetches and prefetches started below
  // (and the evictions they make) must not drop a tensor of this lease already found in RAM.
  leasing_.clear();
  for (Tensor* t : tensors) leasing_.insert(t->id);
  auto r = prepare_lease_impl(session, tensors, mode);
  leasing_.clear();
  return r;
}

Result<bool> NvmeTier::prepare_lease_impl(uint64_t session, std::span<Tensor* const> tensors,
                                          LeaseMode mode) {
  double now = now_s();
  auto pit = plans_.find(session);
  bool wait = false;
  bool moved = false;
  const bool place = may_place_for_overwrite(tensors, mode);
  if (place) {
    // kBusy: no room without waiting for write-backs; the lease waits (below) and retries.
    if (Status st = place_for_overwrite(tensors); !st && st.code() != Code::kBusy) return fail(std::move(st));
  }
  uint64_t advanced_uses = 0;
  for (Tensor* t : tensors) {
    if (pit != plans_.end() && pit->second.pool_id == t->pool_id) {
      Plan& pl = pit->second;
      bool advanced = false;
      pl.cursor = pl.index.advance_cursor(pl.cursor, t->id, tensors.size(), advanced);
      if (advanced) advanced_uses++;
    }
    TensorIo& s = ts(t->id);
    if (t->ram) {
      stats_.hits++;
      continue;
    }
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p) return fail(Code::kInternal, "tensor without a pool");
    if (!place) {
      TIER_TRY(fill_if_in_no_tier(*p, *t));
      if (t->ram) continue;
    }
    wait = true;
    if (place) continue;               // waits for room, never for a read
    if (s.io == Io::kFetch) continue;  // a prefetch is under way: a stall, not a miss
    if (!t->nvme) continue;            // in no tier: lease_ready() zero-fills it when RAM is free
    stats_.misses++;
    pin(std::span<const uint64_t>(&t->id, 1));
    // kBusy: RAM is being freed by write-backs; lease_ready() starts the fetch when they end.
    if (Status st = start_fetch(*p, *t, true, std::nullopt); !st && st.code() != Code::kBusy)
      return fail(std::move(st));
  }
  if (advanced_uses > 0) {
    // One sample per lease: the time since the plan last advanced spread over the uses this
    // lease covers (a batch's uses all arrive at once; sampled one by one, each after the
    // first would read as a zero gap and drag the estimate towards 0).
    Plan& pl = pit->second;
    const double gap = now - pl.last_advance;
    if (pl.last_advance > 0 && gap < 10.0) {
      const double per_use = gap / static_cast<double>(advanced_uses);
      pl.seconds_per_use = pl.seconds_per_use == 0 ? per_use : 0.8 * pl.seconds_per_use + 0.2 * per_use;
    }
    pl.last_advance = now;
    moved = true;
  }
  if (wait) {
    for (Tensor* t : tensors) pinned_.insert(t->id);
    stats_.stalls++;
  }
  if (moved) {
    next_prefetch_ = 0;
    schedule_prefetch();
  }
  return wait;
}

Status NvmeTier::lease_ready(std::span<Tensor* const> tensors, bool& ready, LeaseMode mode) {
  leasing_.clear();
  for (Tensor* t : tensors) leasing_.insert(t->id);
  Status st = lease_ready_impl(tensors, ready, mode);
  leasing_.clear();
  return st;
}

Status NvmeTier::lease_ready_impl(std::span<Tensor* const> tensors, bool& ready, LeaseMode mode) {
  ready = true;
  const bool place = may_place_for_overwrite(tensors, mode);
  if (place) {
    if (Status st = place_for_overwrite(tensors); !st && st.code() != Code::kBusy) return st;
  }
  for (Tensor* t : tensors) {
    if (t->ram) continue;
    TensorIo& s = ts(t->id);
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p) return Status(Code::kNotFound, "tensor '" + t->name + "' was deleted");
    if (!place) {
      TIER_TRY(fill_if_in_no_tier(*p, *t));
      if (t->ram) continue;
    }
    ready = false;
    if (place) continue;  // waiting for room for the overwrite
    if (s.io == Io::kFetch) continue;
    if (!t->nvme) continue;  // in no tier: zero-filled above once write-backs free RAM
    if (s.error) return *s.error;
    if (Status st = start_fetch(*p, *t, true, std::nullopt); !st && st.code() != Code::kBusy) return st;
  }
  return Status::ok();
}

Status NvmeTier::fill_if_in_no_tier(Pool& pool, Tensor& t) {
  if (t.ram || t.nvme || ts(t.id).io != Io::kNone) return Status::ok();
  Status st = start_fetch(pool, t, true, std::nullopt);  // zero-fills: nothing to read
  return st.code() == Code::kBusy ? Status::ok() : st;
}

void NvmeTier::lease_waited(Clock::duration waited) {
  stats_.stall_us +=
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(waited).count());
}

void NvmeTier::on_granted(std::span<Tensor* const> tensors, LeaseMode mode) {
  for (Tensor* t : tensors) {
    TensorIo& s = ts(t->id);
    s.last_use = tick_++;
    if (is_write(mode)) {
      s.write_gen++;
      s.dead = false;
      t->dirty = true;
    }
  }
}

void NvmeTier::discard(std::span<Tensor* const> tensors) {
  for (Tensor* t : tensors) {
    ts(t->id).discarded_before = true;
    if (!t->ram || t->writer || !needs_writeback(*t)) continue;
    TensorIo& s = ts(t->id);
    if (s.io != Io::kNone || s.torn_copy) continue;
    if (t->nvme) {
      // The write lease that made it dirty journaled the NVMe copy as dropped: record it
      // again, so the journal and memory agree that it is the tensor's fallback.
      if (durable_) durable_->nvme_copy_written(*t, *t->nvme);
      t->dirty = false;
    } else {
      s.dead = true;
    }
    stats_.discarded_bytes += t->size;
  }
}

Result<std::byte*> NvmeTier::place_for_restore(Pool& pool, Tensor& t) {
  wait_idle(t.id);
  while (!t.ram) {
    auto loc = allocate(pool, t.node, t.size);
    if (loc) {
      t.ram = *loc;
      if (durable_) durable_->ram_placed(t);
      stats_.fetches_skipped++;
      break;
    }
    // kBusy: only write-backs in flight can free the room; wait for them.
    if (loc.error().code() != Code::kBusy || engine_->pending() == 0) return fail(loc.error());
    engine_->wait();
    flush_drops();
  }
  Tensor* one = &t;
  on_granted(std::span<Tensor* const>(&one, 1), LeaseMode::kWrite);
  std::byte* p = ram_ptr(*t.ram);
  if (!p) return fail(Code::kInternal, "tensor '" + t.name + "': its arena is not mapped");
  return p;
}

}  // namespace tier::daemon
