// RequestHandler: sessions, replies, authorization, dispatch and Hello. The requests live in
// request_handler_{catalog,leases,arenas,status,tiering,durability,reclaim}.cpp.
#include "rpc/request_handler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fcntl.h>
#include <unistd.h>

#include "tiering/admission.hpp"
#include "base/log.hpp"
#include "rpc/request_util.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

using namespace tier::wire;

RequestHandler::RequestHandler(DaemonState& state)
    : state_(state), leases_(state.lease_parts()), pools_(state.pool_parts()) {
  // Every write lease's end is journaled, so a restarted daemon knows which are still held.
  state_.leases.on_write_end = [this](const LeaseTable::Lease& l) {
    if (!state_.durable) return;
    if (const Tensor* t = state_.catalog.find_tensor(l.tensor_id)) state_.durable->write_lease_ended(*t);
  };
}

RequestHandler::~RequestHandler() {
  state_.leases.on_write_end = nullptr;
  for (auto& [id, fd] : ro_fds_) ::close(fd);
}

void RequestHandler::session_opened(Session& s) { leases_.session_opened(s); }

void RequestHandler::session_closed(Session& s) {
  if (s.counted) uids_.remove_connection(s.uid);
  s.counted = false;
  bool freed = leases_.session_closed(s);
  // Its DMA pins go with it: their pages no extent holds are punched and stop counting.
  const size_t pins = state_.ram->pins().size();
  state_.ram->drop_pins(s.id, [&](uint64_t pool_id) { return state_.catalog.find_pool(pool_id); });
  if (freed || state_.ram->pins().size() != pins) retry_waiters();
}

// --- replies ---

void RequestHandler::reply_err_raw(uint16_t type, uint32_t request_id, const Status& st, Reply& out) {
  state_.counters.errors++;
  log_debug("request {} (type {}) answered {}", request_id, type, st.to_string());
  Status enc = encode_reply(type, request_id, st, Empty{}, out.bytes);
  (void)enc;  // an error reply is a status and a message capped at kMaxStringBytes: it fits
}

void RequestHandler::reply_err(const Header& h, const Status& st, Reply& out) {
  reply_err_raw(h.type, h.request_id, st, out);
}

// --- authorization ---

// The rules live in daemon/access.{hpp,cpp}.
bool RequestHandler::is_admin(const Session& s) const noexcept {
  return tier::daemon::is_admin(creds(s), state_.admin_gid);
}

Status RequestHandler::may_use(const Session& s, const Pool& p) const {
  return check_right(creds(s), p, Right::kUse, state_.admin_gid);
}

Status RequestHandler::may_inspect(const Session& s, const Pool& p) const {
  return check_right(creds(s), p, Right::kInspect, state_.admin_gid);
}

Result<Pool*> RequestHandler::pool_named(const std::string& name) {
  Pool* p = state_.catalog.find_pool(name);
  if (!p) return fail(Code::kNotFound, "no pool named '" + name + "'");
  return p;
}

Result<Pool*> RequestHandler::pool_for(const Session& s, const std::string& name, PoolAccess a) {
  auto p = pool_named(name);
  if (!p) return p;
  TIER_TRY(a == PoolAccess::kUse ? may_use(s, **p) : may_inspect(s, **p));
  return p;
}

// --- dispatch ---

void RequestHandler::handle(Session& s, std::span<const std::byte> datagram, Reply& out) {
  out.reset();
  state_.counters.requests++;
  auto hdr = parse_header(datagram);
  if (!hdr) {
    // The header cannot be trusted: drop the connection. When it is recognisably ours (magic
    // and a known type: e.g. another protocol version) say why first.
    state_.counters.errors++;
    out.close = true;
    if (datagram.size() >= kHeaderBytes) {
      Header raw;
      std::memcpy(&raw, datagram.data(), kHeaderBytes);
      uint16_t type = raw.type & static_cast<uint16_t>(~kReplyBit);
      if (raw.magic == kMagic && type >= 1 && type <= kMaxMsgType)
        reply_err_raw(type, raw.request_id, hdr.error(), out);
    }
    return;
  }
  const Header& h = *hdr;
  if (h.type & kReplyBit) {
    reply_err_raw(h.type & static_cast<uint16_t>(~kReplyBit), h.request_id,
                  Status(Code::kProtocol, "clients send requests, not replies"), out);
    out.close = true;
    return;
  }
  auto payload = payload_of(datagram);
  if (!s.hello && h.type != kType(MsgType::kHello)) {
    reply_err(h, Status(Code::kProtocol, "the first message must be Hello"), out);
    out.close = true;
    return;
  }
  static constexpr std::array<Handler, kMaxMsgType + 1> kHandlers = {
      nullptr,
      &RequestHandler::on_hello,
      &RequestHandler::on_pool_create,
      &RequestHandler::on_pool_open,
      &RequestHandler::on_pool_list,
      &RequestHandler::on_pool_drop,
      &RequestHandler::on_tensor_create,
      &RequestHandler::on_tensor_open,
      &RequestHandler::on_tensor_list,
      &RequestHandler::on_tensor_delete,
      &RequestHandler::on_lease,
      &RequestHandler::on_release,
      &RequestHandler::on_map_arena,
      &RequestHandler::on_status,
      &RequestHandler::on_topo,
      &RequestHandler::on_prefetch,
      &RequestHandler::on_evict,
      &RequestHandler::on_plan_set,
      &RequestHandler::on_snapshot,
      &RequestHandler::on_metrics,
      &RequestHandler::on_discard,
      &RequestHandler::on_lease_reclaim,
      &RequestHandler::on_arena_pin,
      &RequestHandler::on_snapshot_take,
      &RequestHandler::on_snapshot_list,
      &RequestHandler::on_snapshot_restore,
  };
  (this->*kHandlers[h.type])(s, h, payload, out);
}

void RequestHandler::on_hello(Session& s, const Header& h, std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(HelloReq, req);
  if (req.version != kVersion) {
    reply_err(
        h,
        Status(Code::kProtocol, "protocol version " + std::to_string(req.version) +
                                    " is not supported (tierd speaks " + std::to_string(kVersion) + ")"),
        out);
    out.close = true;
    return;
  }
  if (!s.counted) {
    if (!uids_.add_connection(s.uid, state_.config.max_connections_per_uid)) {
      reply_err(
          h,
          Status(Code::kResourceExhausted,
                 "uid " + std::to_string(s.uid) + " has " + std::to_string(uids_.connections(s.uid)) +
                     " connections to tierd; the limit is " +
                     std::to_string(state_.config.max_connections_per_uid) + " (max_connections_per_uid)"),
          out);
      out.close = true;
      return;
    }
    s.counted = true;
  }
  s.hello = true;
  s.pid_start = process_start_time(s.pid);
  s.numa_node = req.numa_node;
  s.name = std::move(req.client_name);
  if (s.name.size() > 255) s.name.resize(255);
  reply_ok(h, HelloRep{kVersion, kDaemonVersion, s.id}, out);
}

}  // namespace tier::daemon
