// RequestHandler: the Lease and Release messages, decoded here and decided by the LeaseService.
#include "rpc/request_handler.hpp"
#include "rpc/request_util.hpp"

namespace tier::daemon {

using namespace tier::wire;

void RequestHandler::on_lease(Session& s, const Header& h, std::span<const std::byte> payload, Reply& out) {
  // Decoded into a member, not with TIER_DECODE: the hot path reuses the request's vector.
  Reader r(payload);
  r(lease_req_);
  if (!r.ok() || !r.at_end()) return reply_err(h, Status(Code::kProtocol, "malformed Lease request"), out);
  LeaseService::Outcome o = leases_.request(s, h.request_id, lease_req_, out.bytes);
  if (!o.status) return reply_err(h, o.status, out);
  out.deferred = o.deferred;
}

void RequestHandler::on_release(Session& s, const Header& h, std::span<const std::byte> payload, Reply& out) {
  Reader r(payload);
  r(release_req_);
  if (!r.ok() || !r.at_end()) return reply_err(h, Status(Code::kProtocol, "malformed Release request"), out);
  if (Status st = leases_.release(s, release_req_.lease_ids); !st) return reply_err(h, st, out);
  reply_ok(h, Empty{}, out);
}

void RequestHandler::retry_waiters() { leases_.retry_waiters(); }

void RequestHandler::expire(Clock::time_point now) { leases_.expire(now); }

}  // namespace tier::daemon
