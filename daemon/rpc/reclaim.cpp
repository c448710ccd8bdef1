// RequestHandler: write leases across a restart (daemon/leases/reclaim.hpp does the work).
#include "durability/durability.hpp"
#include "rpc/request_handler.hpp"
#include "rpc/request_util.hpp"

namespace tier::daemon {

using namespace tier::wire;

std::optional<Clock::time_point> RequestHandler::next_deadline() const {
  auto waiters = state_.leases.next_deadline();
  auto orphans = state_.reclaims.next_check();
  if (!waiters) return orphans;
  if (!orphans) return waiters;
  return std::min(*waiters, *orphans);
}

void RequestHandler::on_lease_reclaim(Session& s, const Header& h, std::span<const std::byte> payload,
                                      Reply& out) {
  TIER_DECODE(LeaseReclaimReq, req);
  if (s.leases.count + 1 > state_.config.max_leases_per_client)
    return reply_err(h,
                     Status(Code::kResourceExhausted,
                            "this client holds " + std::to_string(s.leases.count) + " leases; the limit is " +
                                std::to_string(state_.config.max_leases_per_client)),
                     out);
  const LeaseHolder who = leases_.holder_of(s);
  auto id = state_.reclaims.reclaim(state_.reclaim_parts(), s.leases, who, req.tensor_id, req.lease_id);
  if (!id) return reply_err(h, id.error(), out);
  // An orphan's tensor can be neither deleted nor evicted: it is still there, in RAM.
  Tensor* t = state_.catalog.find_tensor(req.tensor_id);
  if (!t || !t->ram) {
    (void)state_.leases.release(s.leases, *id, state_.catalog);
    return reply_err(h, Status(Code::kInternal, "a reclaimed tensor left RAM"), out);
  }
  if (state_.durable) state_.durable->write_lease_held(*t, *id, who);  // the new id, this holder
  Tensor* one[1] = {t};
  if (state_.tiering) state_.tiering->on_granted(one, LeaseMode::kWrite);
  state_.counters.leases_granted++;
  lease_rep_.grants.assign(1, LeaseGrant{*id, t->id, t->ram->arena_id, t->ram->offset, t->size});
  if (Status st = encode_reply(h.type, h.request_id, Status::ok(), lease_rep_, out.bytes); !st)
    reply_err(h, st, out);
}

}  // namespace tier::daemon
