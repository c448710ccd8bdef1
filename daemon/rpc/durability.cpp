// RequestHandler: the snapshot requests (Snapshot, SnapshotTake, SnapshotList, SnapshotRestore;
// durability.hpp does the work).
#include "durability/durability.hpp"
#include "rpc/request_handler.hpp"
#include "rpc/request_util.hpp"
#include "tiering/nvme_tier.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

using namespace tier::wire;

namespace {

// Snapshots live in the state dir and are charged to the pool's NVMe quota and its owner's
// uid_nvme_quota (with the pools' NVMe copies): one uid cannot fill the disk with them.
Status charge_snapshot(DaemonState& st, const Pool& p) {
  const Durability& d = *st.durable;
  const uint64_t need = Durability::snapshot_estimate(p);
  const uint64_t quota = st.tiering ? st.tiering->nvme_quota(p) : p.nvme_quota;
  const uint64_t snaps = d.snapshot_bytes(p.id);
  if (quota > 0 && (p.nvme_used + snaps > quota || quota - p.nvme_used - snaps < need))
    return Status(Code::kResourceExhausted,
                  "snapshot of pool '" + p.name + "' refused: it needs " + format_size(need) +
                      " of the pool's NVMe quota of " + format_size(quota) + ", which holds " +
                      format_size(p.nvme_used) + " of NVMe copies and " + format_size(snaps) +
                      " of snapshots (snapshots count against the NVMe quota: keep fewer)");
  if (const uint64_t uq = st.sizes.uid_nvme_quota; uq > 0 && p.owner_uid != 0) {
    uint64_t used = 0;
    for (const auto& [name, id] : st.catalog.pool_names()) {
      const Pool* q = st.catalog.find_pool(id);
      if (q && q->owner_uid == p.owner_uid) used += q->nvme_used + d.snapshot_bytes(q->id);
    }
    if (used > uq || uq - used < need)
      return Status(Code::kResourceExhausted, "snapshot of pool '" + p.name + "' refused: it needs " +
                                                  format_size(need) + " and uid " +
                                                  std::to_string(p.owner_uid) + " uses " + format_size(used) +
                                                  " of its NVMe quota of " + format_size(uq) +
                                                  " (uid_nvme_quota) in NVMe copies and snapshots");
  }
  return Status::ok();
}

}  // namespace

Result<Pool*> RequestHandler::snapshot_pool(const Session& s, const std::string& name) {
  auto pr = pool_for(s, name, PoolAccess::kUse);
  if (!pr) return pr;
  if (!state_.durable) return fail(Code::kUnsupported, "snapshots need the journal (a tierd state dir)");
  return pr;
}

void RequestHandler::take_snapshot(Session& s, const Header& h, const std::string& pool, uint64_t tag,
                                   uint32_t keep, Reply& out) {
  auto pr = snapshot_pool(s, pool);
  if (!pr) return reply_err(h, pr.error(), out);
  if (Status st = charge_snapshot(state_, **pr); !st) return reply_err(h, st, out);
  if (Status st = state_.durable->start_snapshot(**pr, s.id, h.request_id, h.type, tag, keep); !st)
    return reply_err(h, st, out);
  out.deferred = true;  // answered by Durability::poll once the snapshot is durable
}

void RequestHandler::on_snapshot(Session& s, const Header& h, std::span<const std::byte> payload,
                                 Reply& out) {
  TIER_DECODE(PoolNameReq, req);
  take_snapshot(s, h, req.name, 0, 1, out);
}

void RequestHandler::on_snapshot_take(Session& s, const Header& h, std::span<const std::byte> payload,
                                      Reply& out) {
  TIER_DECODE(SnapshotTakeReq, req);
  take_snapshot(s, h, req.pool, req.tag, req.keep, out);
}

void RequestHandler::on_snapshot_list(Session& s, const Header& h, std::span<const std::byte> payload,
                                      Reply& out) {
  TIER_DECODE(PoolNameReq, req);
  auto pr = pool_for(s, req.name, PoolAccess::kUse);
  if (!pr) return reply_err(h, pr.error(), out);
  SnapshotListRep rep;
  if (state_.durable) {
    const auto& pools = state_.durable->image().pools();
    if (auto it = pools.find((*pr)->id); it != pools.end()) {
      if (it->second.recovered) {
        rep.recovered = true;
        rep.recovered_from = it->second.recovered->snapshot_id;
        rep.lost = it->second.recovered->lost;
      }
      for (const auto& [sid, snap] : it->second.snapshots)
        if (snap.durable) rep.snapshots.push_back(SnapshotInfoW{sid, snap.tag, snap.bytes});
    }
  }
  reply_ok(h, rep, out);
}

void RequestHandler::on_snapshot_restore(Session& s, const Header& h, std::span<const std::byte> payload,
                                         Reply& out) {
  TIER_DECODE(SnapshotRestoreReq, req);
  auto pr = snapshot_pool(s, req.pool);
  if (!pr) return reply_err(h, pr.error(), out);
  Durability::RestoreHooks hooks;
  hooks.place = [this](Pool& p, Tensor& t) -> Result<std::byte*> {
    Result<std::byte*> dst =
        fail(Code::kInternal, "tensor '" + t.name + "' is in no tier and there is no NVMe tier");
    if (state_.tiering) {
      dst = state_.tiering->place_for_restore(p, t);
    } else if (t.ram) {
      Arena* a = state_.ram->arena(t.ram->arena_id);
      if (a) dst = a->base() + t.ram->offset;
    }
    // The NVMe copy is stale from here (as at a write lease's grant).
    if (dst && t.nvme) state_.durable->nvme_copy_dropped(t);
    return dst;
  };
  hooks.erase = [this](Pool& p, Tensor& t) { erase_tensor(p, t); };
  auto r = state_.durable->restore_snapshot(**pr, req.snapshot_id, hooks);
  if (!r) return reply_err(h, r.error(), out);
  reply_ok(h, SnapshotRestoreRep{r->tensors, r->bytes, r->deleted, r->dropped_snapshots}, out);
  retry_waiters();
}

Status RequestHandler::snapshot_poll() {
  if (!state_.durable) return Status::ok();
  bool released = false;
  Status st = state_.durable->poll(leases_.deferred_sink(), &released);
  if (released && state_.leases.waiter_count() > 0) retry_waiters();
  return st;
}

}  // namespace tier::daemon
