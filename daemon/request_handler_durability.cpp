// RequestHandler: the Snapshot request (durability.hpp does the work).
#include "daemon/durability.hpp"
#include "daemon/request_handler.hpp"

namespace tier::daemon {

using namespace tier::wire;

void RequestHandler::on_snapshot(Session& s, const Header& h, std::span<const std::byte> payload,
                                 Reply& out) {
  auto req = decode<PoolNameReq>(payload);
  if (!req) return reply_err(h, req.error(), out);
  auto pr = pool_for(s, req->name, PoolAccess::kUse);
  if (!pr) return reply_err(h, pr.error(), out);
  if (!state_.durable)
    return reply_err(h, Status(Code::kUnsupported, "snapshots need the journal (a tierd state dir)"), out);
  if (Status st = state_.durable->start_snapshot(**pr, s.id, h.request_id); !st) return reply_err(h, st, out);
  out.deferred = true;  // answered by Durability::poll once the snapshot is durable
}

Status RequestHandler::snapshot_poll() {
  if (!state_.durable) return Status::ok();
  bool released = false;
  Status st = state_.durable->poll(sink_, &released);
  if (released && state_.leases.waiter_count() > 0) retry_waiters();
  return st;
}

}  // namespace tier::daemon

namespace tier::daemon {

bool RequestHandler::snapshot_pinned() const {
  return state_.durable && state_.durable->pinned(scratch_tensors_);
}

}  // namespace tier::daemon
