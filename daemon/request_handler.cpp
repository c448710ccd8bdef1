#include "daemon/request_handler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fcntl.h>
#include <unistd.h>

#include "daemon/admission.hpp"
#include "daemon/log.hpp"

namespace tier::daemon {

using namespace tier::wire;

namespace {

constexpr uint16_t kType(MsgType t) { return static_cast<uint16_t>(t); }

// Room left for the reply status and vector counts when filling a list reply.
constexpr size_t kListBudget = kMaxMessageBytes - 1024;

// Grants that fit one LeaseRep, as the codec sizes them: the header, an ok ReplyStatus, the
// grant vector's count, then one LeaseGrant each (1637; docs/daemon.md). Below wire::kMaxBatch,
// so it bounds lease batches.
const size_t kMaxLeaseGrants =
    (kMaxMessageBytes - kHeaderBytes - encoded_size(ReplyStatus{}) - encoded_size(LeaseRep{})) /
    encoded_size(LeaseGrant{});

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

uint64_t ms_since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

}  // namespace

RequestHandler::RequestHandler(DaemonState& state) : state_(state), pid_ns_(own_pid_ns()) {
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

namespace {
PeerCreds creds(const Session& s) { return PeerCreds{s.uid, s.gid, s.groups}; }

// A pool as clients see it: a stored NVMe quota of 0 means the daemon's default
// (nvme_pool_quota of the NVMe tier), so the effective quota is reported, as enforced.
PoolInfo effective_info(const DaemonState& st, const Pool& p) {
  PoolInfo i = pool_info(p);
  if (st.tiering) i.nvme_quota = st.tiering->nvme_quota(p);
  return i;
}
}  // namespace

void RequestHandler::session_opened(Session& s) {
  s.leases.session_id = s.id;
  sessions_[s.id] = &s;
}

void RequestHandler::session_closed(Session& s) {
  sessions_.erase(s.id);
  if (s.counted) uids_.remove_connection(s.uid);
  s.counted = false;
  state_.leases.drop_waiters(s.id);
  if (state_.tiering) state_.tiering->session_closed(s.id);
  size_t n = state_.leases.release_all(s.leases, state_.catalog);
  if (n > 0) {
    log_debug("session {} (pid {}) closed holding {} leases; released", s.id, s.pid, n);
    retry_waiters();
  }
}

// --- replies ---

void RequestHandler::reply_err_raw(uint16_t type, uint32_t request_id, const Status& st,
                                   Reply& out) {
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
  if (Status st = a == PoolAccess::kUse ? may_use(s, **p) : may_inspect(s, **p); !st) return fail(std::move(st));
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

#define TIER_DECODE(T, var)                                                       \
  auto var##_r = decode<T>(payload);                                             \
  if (!var##_r) return reply_err(h, var##_r.error(), out);                       \
  T& var = *var##_r

void RequestHandler::on_hello(Session& s, const Header& h, std::span<const std::byte> payload,
                              Reply& out) {
  TIER_DECODE(HelloReq, req);
  if (req.version != kVersion) {
    reply_err(h, Status(Code::kProtocol, "protocol version " + std::to_string(req.version) +
                                             " is not supported (tierd speaks " +
                                             std::to_string(kVersion) + ")"),
              out);
    out.close = true;
    return;
  }
  if (!s.counted) {
    if (!uids_.add_connection(s.uid, state_.config.max_connections_per_uid)) {
      reply_err(h, Status(Code::kResourceExhausted,
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

void RequestHandler::on_pool_create(Session& s, const Header& h,
                                    std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(PoolCreateReq, req);
  if (Status st = validate_pool_name(req.name); !st) return reply_err(h, st, out);
  if (Pool* p = state_.catalog.find_pool(req.name)) {
    if (!req.exist_ok) return reply_err(h, Status(Code::kAlreadyExists, "pool '" + req.name + "' exists"), out);
    if (Status st = may_use(s, *p); !st) return reply_err(h, st, out);
    return reply_ok(h, to_wire(effective_info(state_, *p)), out);
  }
  uint64_t quota = req.ram_quota == 0 ? state_.sizes.pool_quota : req.ram_quota;
  if (quota > state_.ram->capacity())
    return reply_err(h, Status(Code::kResourceExhausted,
                               "RAM quota " + format_size(quota) + " exceeds the RAM tier of " +
                                   format_size(state_.ram->capacity())),
                     out);
  if (req.group_read && req.group == UINT32_MAX)
    return reply_err(h, Status(Code::kInvalidArgument, "group read access needs a group"), out);
  uint64_t nvme_quota = req.nvme_quota;
  if (uint64_t uq = state_.sizes.uid_nvme_quota; uq > 0) {
    // Per-uid NVMe quota: the pools' NVMe quotas are reserved from it (0 takes what is left).
    UidUsage u = uid_usage(state_.catalog, s.uid);
    uint64_t left = u.nvme_quota >= uq ? 0 : uq - u.nvme_quota;
    if (nvme_quota == 0) nvme_quota = left;
    if (nvme_quota == 0 || nvme_quota > left)
      return reply_err(h, Status(Code::kResourceExhausted,
                                 "uid " + std::to_string(s.uid) + " has reserved " + format_size(u.nvme_quota) +
                                     " of its NVMe quota of " + format_size(uq) + " (uid_nvme_quota); " +
                                     format_size(left) + " left"),
                       out);
  }
  auto p = state_.catalog.create_pool(req.name, s.uid, quota, nvme_quota);
  if (!p) return reply_err(h, p.error(), out);
  (*p)->group = req.group == UINT32_MAX ? kNoGroup : static_cast<gid_t>(req.group);
  (*p)->group_read = req.group_read;
  if (state_.durable) state_.durable->pool_created(**p);
  log_info("pool '{}' created by uid {} (RAM quota {})", req.name, s.uid, format_size(quota));
  reply_ok(h, to_wire(effective_info(state_, **p)), out);
}

void RequestHandler::on_pool_open(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(PoolNameReq, req);
  auto p = pool_for(s, req.name, PoolAccess::kInspect);
  if (!p) return reply_err(h, p.error(), out);
  reply_ok(h, to_wire(effective_info(state_, **p)), out);
}

void RequestHandler::on_pool_list(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(Empty, req);
  (void)req;
  PoolListRep rep;
  size_t bytes = 0;
  for (const auto& [name, id] : state_.catalog.pool_names()) {
    Pool* p = state_.catalog.find_pool(id);
    if (!p || !may_see(creds(s), *p, state_.admin_gid)) continue;
    PoolInfoW w = to_wire(effective_info(state_, *p));
    bytes += encoded_size(w);
    if (bytes > kListBudget) break;  // 1000+ pools: the rest does not fit one reply
    rep.pools.push_back(std::move(w));
  }
  reply_ok(h, rep, out);
}

void RequestHandler::on_pool_drop(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(PoolNameReq, req);
  auto pr = pool_named(req.name);
  if (!pr) return reply_err(h, pr.error(), out);
  Pool& p = **pr;
  if (s.uid != p.owner_uid && !is_admin(s)) return reply_err(h, may_use(s, p), out);
  if (p.leases > 0)
    return reply_err(h, Status(Code::kBusy, "pool '" + p.name + "' has " + std::to_string(p.leases) +
                                                " leases held"),
                     out);
  // A million-tensor pool must not stall the loop for long: extents are not freed one by one
  // (their allocators go with the arenas), only the usage counts are taken off per node.
  std::map<int32_t, std::pair<uint64_t, uint64_t>> usage;  // node -> (bytes, extents)
  for (auto& [id, t] : p.tensors) {
    if (state_.tiering) state_.tiering->forget(p, t);
    if (t.ram) {
      auto& u = usage[t.ram->node];
      u.first += t.ram->length;
      u.second++;
    }
  }
  for (const auto& [node, u] : usage) state_.ram->forget_usage(p, node, u.first, u.second);
  close_read_only_fds(p.id);
  state_.ram->drop_pool(p.id);
  log_info("pool '{}' dropped by uid {} ({} tensors)", p.name, s.uid, p.tensors.size());
  if (state_.durable) state_.durable->pool_dropped(p);
  state_.catalog.erase_pool(p.id);
  reply_ok(h, Empty{}, out);
  retry_waiters();  // waiters on its tensors now get kNotFound
}

void RequestHandler::on_tensor_create(Session& s, const Header& h,
                                      std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(TensorCreateReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kUse);
  if (!pr) return reply_err(h, pr.error(), out);
  Pool& p = **pr;
  if (Status st = validate_tensor_name(req.name); !st) return reply_err(h, st, out);
  if (req.size == 0) return reply_err(h, Status(Code::kInvalidArgument, "tensor size must be > 0"), out);
  if (req.dtype > kMaxDType) return reply_err(h, Status(Code::kInvalidArgument, "unknown dtype"), out);
  if (req.shape.size() > 8)
    return reply_err(h, Status(Code::kInvalidArgument, "a shape has at most 8 dimensions"), out);
  for (int64_t d : req.shape)
    if (d < 0) return reply_err(h, Status(Code::kInvalidArgument, "negative shape dimension"), out);
  if (req.placement_kind > 2)
    return reply_err(h, Status(Code::kInvalidArgument, "unknown placement kind"), out);
  if (Tensor* t = state_.catalog.find_tensor(p, req.name)) {
    if (!req.exist_ok || t->size != req.size)
      return reply_err(h, Status(Code::kAlreadyExists,
                                 "tensor '" + req.name + "' exists in pool '" + p.name + "'" +
                                     (t->size != req.size ? " with size " + std::to_string(t->size) : "")),
                       out);
    return reply_ok(h, to_wire(tensor_info(*t)), out);
  }
  Placement pl{static_cast<Placement::Kind>(req.placement_kind), req.placement_index};
  auto node = choose_node(state_.topology, pl, s.numa_node);
  if (!node) return reply_err(h, node.error(), out);
  // Refused now when no lease could ever hold it (daemon/admission.hpp).
  if (Status st = admit_tensor(*state_.ram, state_.tiering.get(), p, *node, req.size, req.name); !st)
    return reply_err(h, st, out);
  if (uint64_t uq = state_.sizes.uid_ram_quota; uq > 0) {
    UidUsage u = uid_usage(state_.catalog, p.owner_uid);
    if (req.size > uq - std::min(uq, u.ram_used))
      return reply_err(h, Status(Code::kResourceExhausted,
                                 "uid " + std::to_string(p.owner_uid) + " uses " + format_size(u.ram_used) +
                                     " of its RAM quota of " + format_size(uq) + " (uid_ram_quota); " +
                                     format_size(req.size) + " more do not fit"),
                       out);
  }
  auto loc = state_.tiering ? state_.tiering->allocate(p, *node, req.size)
                            : state_.ram->allocate(p, *node, req.size);
  // With an NVMe tier, room that only write-backs in flight can free is not waited for on the
  // event loop: the tensor starts in no tier (it reads as zeros, as a new tensor does) and gets
  // RAM at its first lease, which is deferred like any lease that needs room.
  const bool in_no_tier = !loc && state_.tiering && loc.error().code() == Code::kBusy;
  if (!loc && !in_no_tier) return reply_err(h, loc.error(), out);
  TensorDesc desc{std::move(req.name), req.size, static_cast<DType>(req.dtype), std::move(req.shape), pl};
  auto t = state_.catalog.create_tensor(p, std::move(desc), *node);
  if (!t) {
    if (loc) state_.ram->release(p, *loc);
    return reply_err(h, t.error(), out);
  }
  if (loc) (*t)->ram = *loc;
  if (state_.durable) state_.durable->tensor_created(**t);
  reply_ok(h, to_wire(tensor_info(**t)), out);
}

void RequestHandler::on_tensor_open(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE(TensorRefReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kInspect);
  if (!pr) return reply_err(h, pr.error(), out);
  Tensor* t = state_.catalog.find_tensor(**pr, req.name);
  if (!t)
    return reply_err(h, Status(Code::kNotFound, "no tensor '" + req.name + "' in pool '" + req.pool + "'"), out);
  reply_ok(h, to_wire(tensor_info(*t)), out);
}

void RequestHandler::on_tensor_list(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE(TensorListReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kInspect);
  if (!pr) return reply_err(h, pr.error(), out);
  const Pool& p = **pr;
  TensorListRep rep;
  size_t bytes = 0;
  uint32_t max = req.max == 0 ? UINT32_MAX : req.max;
  for (auto it = p.tensors.upper_bound(req.after_id); it != p.tensors.end(); ++it) {
    TensorInfoW w = to_wire(tensor_info(it->second));
    size_t sz = encoded_size(w);
    if (rep.tensors.size() >= max || bytes + sz > kListBudget) {
      rep.more = true;
      break;
    }
    bytes += sz;
    rep.tensors.push_back(std::move(w));
  }
  reply_ok(h, rep, out);
}

void RequestHandler::on_tensor_delete(Session& s, const Header& h,
                                      std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(TensorRefReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kUse);
  if (!pr) return reply_err(h, pr.error(), out);
  Pool& p = **pr;
  Tensor* t = state_.catalog.find_tensor(p, req.name);
  if (!t)
    return reply_err(h, Status(Code::kNotFound, "no tensor '" + req.name + "' in pool '" + req.pool + "'"), out);
  if (t->readers > 0 || t->writer)
    return reply_err(h, Status(Code::kBusy, "tensor '" + req.name + "' is leased"), out);
  erase_tensor(p, *t);
  reply_ok(h, Empty{}, out);
  retry_waiters();
}

void RequestHandler::erase_tensor(Pool& p, Tensor& t) {
  if (state_.tiering) state_.tiering->forget(p, t);
  if (t.ram) state_.ram->release(p, *t.ram);
  if (state_.durable) state_.durable->tensor_deleted(t);
  state_.catalog.erase_tensor(p, t.id);
}

// --- leases (hot path) ---

Status RequestHandler::resolve_for_lease(const Session& s, std::span<const uint64_t> ids, LeaseMode mode) {
  scratch_tensors_.clear();
  for (uint64_t id : ids) {
    Tensor* t = state_.catalog.find_tensor(id);
    if (!t) return Status(Code::kNotFound, "no tensor with id " + std::to_string(id));
    Pool* p = state_.catalog.find_pool(t->pool_id);
    if (!p) return Status(Code::kInternal, "tensor without a pool");
    if (p->owner_uid != s.uid) {
      Status st = check_right(creds(s), *p, mode == LeaseMode::kRead ? Right::kRead : Right::kUse, state_.admin_gid);
      if (!st) return st;
    }
    if (!t->ram && !state_.tiering)
      return Status(Code::kUnsupported, "tensor '" + t->name + "' is not in RAM and the NVMe tier is not configured");
    scratch_tensors_.push_back(t);
  }
  // A running snapshot copies these first; the lease then waits for its pins (durability.hpp).
  if (is_write(mode) && state_.durable) state_.durable->copy_before_write(scratch_tensors_);
  return Status::ok();
}

Status RequestHandler::overwrite_conflict(LeaseMode mode) const {
  // An overwrite lease places tensors only on NVMe without a read only when it can be granted
  // right after: otherwise the placed, unspecified bytes would sit unleased while it waits. So
  // while a conflicting lease is held it prepares nothing (its bytes are dead: there is nothing
  // worth fetching, and a corrupt NVMe copy must not fail it) and waits like any conflict.
  return mode == LeaseMode::kOverwrite ? state_.leases.check(mode, scratch_tensors_) : Status::ok();
}

Status RequestHandler::grant(Session& s, LeaseMode mode, uint32_t request_id,
                             std::vector<std::byte>& out) {
  scratch_ids_.clear();
  // The grant hands out t->ram; a tensor that left RAM since it was checked would hand out an
  // extent now owned by another tensor (the tier keeps a lease's tensors resident until here).
  for (const Tensor* t : scratch_tensors_)
    if (!t->ram)
      return Status(Code::kInternal, "tensor '" + t->name + "' left RAM before its lease was granted");
  TIER_RETURN_IF_ERROR(state_.leases.acquire(s.leases, mode, scratch_tensors_, state_.catalog, scratch_ids_));
  state_.counters.leases_granted += scratch_ids_.size();
  state_.counters.hits += scratch_ids_.size();
  if (state_.durable && is_write(mode)) {
    // The NVMe copy becomes stale, and the lease is journaled: a restarted daemon keeps the
    // extent for this holder (daemon/lease_reclaim.hpp).
    const LeaseHolder holder = holder_of(s);
    for (size_t i = 0; i < scratch_tensors_.size(); ++i) {
      Tensor& t = *scratch_tensors_[i];
      if (t.nvme) state_.durable->nvme_copy_dropped(t);
      state_.durable->write_lease_held(t, scratch_ids_[i], holder);
    }
  }
  if (state_.tiering) state_.tiering->on_granted(scratch_tensors_, mode);
  lease_rep_.grants.resize(scratch_tensors_.size());
  for (size_t i = 0; i < scratch_tensors_.size(); ++i) {
    const Tensor& t = *scratch_tensors_[i];
    lease_rep_.grants[i] = LeaseGrant{scratch_ids_[i], t.id, t.ram->arena_id, t.ram->offset, t.size};
  }
  Status st = encode_reply(kType(MsgType::kLease), request_id, Status::ok(), lease_rep_, out);
  if (!st) {
    // Cannot happen: a lease names at most kMaxLeaseGrants tensors. Undo rather than hold
    // unreported leases.
    for (uint64_t id : scratch_ids_) (void)state_.leases.release(s.leases, id, state_.catalog);
    return st;
  }
  return Status::ok();
}

void RequestHandler::on_lease(Session& s, const Header& h, std::span<const std::byte> payload,
                              Reply& out) {
  const uint64_t t_receipt = now_ns();
  Reader r(payload);
  r(lease_req_);
  if (!r.ok() || !r.at_end())
    return reply_err(h, Status(Code::kProtocol, "malformed Lease request"), out);
  const LeaseReq& req = lease_req_;
  if (req.mode < static_cast<uint8_t>(LeaseMode::kRead) || req.mode > kMaxLeaseMode)
    return reply_err(h, Status(Code::kInvalidArgument, "lease mode must be read, write or overwrite"), out);
  if (req.tensor_ids.empty() || req.tensor_ids.size() > kMaxLeaseGrants)
    return reply_err(h, Status(Code::kInvalidArgument,
                               "a lease names 1.." + std::to_string(kMaxLeaseGrants) +
                                   " tensors (the grants must fit one 64 KiB reply)"),
                     out);
  if (s.leases.count + req.tensor_ids.size() > state_.config.max_leases_per_client)
    return reply_err(h, Status(Code::kResourceExhausted,
                               "this client holds " + std::to_string(s.leases.count) +
                                   " leases; the limit is " + std::to_string(state_.config.max_leases_per_client)),
                     out);
  LeaseMode mode = static_cast<LeaseMode>(req.mode);
  if (Status st = resolve_for_lease(s, req.tensor_ids, mode); !st) return reply_err(h, st, out);
  const Status conflict = overwrite_conflict(mode);
  if (state_.tiering && conflict.is_ok()) {
    // Tensors only on NVMe are fetched first; the reply waits for them like a lease wait.
    auto must_wait = state_.tiering->prepare_lease(s.id, scratch_tensors_, mode);
    if (!must_wait) return reply_err(h, must_wait.error(), out);
    if (*must_wait) {
      Waiter w;
      w.session_id = s.id;
      w.request_id = h.request_id;
      w.mode = mode;
      w.tensor_ids = req.tensor_ids;
      if (req.timeout_ms > 0) w.deadline = Clock::now() + std::chrono::milliseconds(req.timeout_ms);
      w.io = true;
      w.fail_fast = req.timeout_ms == 0;
      w.since = Clock::now();
      state_.leases.add_waiter(std::move(w));
      out.deferred = true;
      return;
    }
  }
  Status st = conflict.is_ok() ? grant(s, mode, h.request_id, out.bytes) : conflict;
  if (st) {
    lease_latency_.observe(now_ns() - t_receipt);
    return;
  }
  // A snapshot's pin is not a client's lease: a fail-fast lease waits for it (one tensor copy).
  if (st.code() != Code::kBusy || (req.timeout_ms == 0 && !snapshot_pinned())) return reply_err(h, st, out);
  if (s.waiting >= state_.config.max_waiters_per_client)
    return reply_err(h, Status(Code::kResourceExhausted,
                               "this client has " + std::to_string(s.waiting) +
                                   " lease requests waiting; the limit is " +
                                   std::to_string(state_.config.max_waiters_per_client) + " (max_waiters_per_client)"),
                     out);
  s.waiting++;
  Waiter w;
  w.session_id = s.id;
  w.request_id = h.request_id;
  w.mode = mode;
  w.tensor_ids = req.tensor_ids;
  if (req.timeout_ms > 0) w.deadline = Clock::now() + std::chrono::milliseconds(req.timeout_ms);
  w.fail_fast = req.timeout_ms == 0;
  state_.leases.add_waiter(std::move(w));
  state_.counters.lease_waits++;
  state_.counters.stalls++;
  out.deferred = true;
}

void RequestHandler::on_release(Session& s, const Header& h, std::span<const std::byte> payload,
                                Reply& out) {
  Reader r(payload);
  r(release_req_);
  if (!r.ok() || !r.at_end())
    return reply_err(h, Status(Code::kProtocol, "malformed Release request"), out);
  if (release_req_.lease_ids.size() > kMaxBatch)
    return reply_err(h, Status(Code::kInvalidArgument, "a release names at most " + std::to_string(kMaxBatch) + " leases"), out);
  // All or nothing: every id must be a lease of this session.
  for (uint64_t id : release_req_.lease_ids) {
    const LeaseTable::Lease* l = state_.leases.find(id);
    if (!l || l->session_id != s.id)
      return reply_err(h, Status(Code::kNotFound, "no lease " + std::to_string(id) + " held by this client"), out);
  }
  size_t released = 0;
  for (uint64_t id : release_req_.lease_ids)
    if (state_.leases.release(s.leases, id, state_.catalog)) ++released;  // a repeated id fails
  reply_ok(h, Empty{}, out);
  if (released > 0 && state_.leases.waiter_count() > 0) retry_waiters();
}

void RequestHandler::retry_waiters() {
  if (state_.tiering) state_.tiering->clear_pins();
  state_.leases.retry_waiters([&](Waiter& w) {
    auto it = sessions_.find(w.session_id);
    if (it == sessions_.end()) return true;
    Session& s = *it->second;
    Status st = resolve_for_lease(s, w.tensor_ids, w.mode);
    if (st) st = overwrite_conflict(w.mode);  // kBusy: waits below, preparing nothing
    if (st && state_.tiering) {
      bool ready = false;
      st = state_.tiering->lease_ready(scratch_tensors_, ready, w.mode);
      if (st && !ready) {
        state_.tiering->pin(w.tensor_ids);  // fetched tensors stay until the grant
        return false;
      }
    }
    if (st) st = grant(s, w.mode, w.request_id, deferred_buf_);
    if (!st && st.code() == Code::kBusy && (!w.fail_fast || snapshot_pinned())) {
      if (state_.tiering) state_.tiering->pin(w.tensor_ids);
      return false;  // still waiting
    }
    if (w.io && state_.tiering) state_.tiering->lease_waited(Clock::now() - w.since);
    if (!st) {
      state_.counters.errors++;
      log_debug("waiting lease {} answered {}", w.request_id, st.to_string());
      (void)encode_reply(kType(MsgType::kLease), w.request_id, st, Empty{}, deferred_buf_);
    }
    if (!w.io && s.waiting > 0) s.waiting--;
    if (sink_) sink_(w.session_id, deferred_buf_);
    return true;
  });
}

void RequestHandler::expire(Clock::time_point now) {
  // A wait that ends at its deadline is the outcome the client asked for (libtier waits in
  // 20 ms slices), so it counts in lease_timeouts, not in errors.
  state_.leases.expire_waiters(now, [&](Waiter& w) {
    state_.counters.lease_timeouts++;
    if (auto it = sessions_.find(w.session_id); !w.io && it != sessions_.end() && it->second->waiting > 0)
      it->second->waiting--;
    Status st(Code::kTimeout, w.io ? "lease not granted within the timeout: its tensors are still being read from NVMe"
                                   : "lease not granted within the timeout: a conflicting lease is still held");
    log_debug("waiting lease {} answered {}", w.request_id, st.to_string());
    (void)encode_reply(kType(MsgType::kLease), w.request_id, st, Empty{}, deferred_buf_);
    if (sink_) sink_(w.session_id, deferred_buf_);
  });
  if (state_.reclaims.sweep(state_, now)) retry_waiters();
}

void RequestHandler::on_map_arena(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(MapArenaReq, req);
  bool owner = false;
  auto ar = arena_for(s, req.arena_id, owner);
  if (!ar) return reply_err(h, ar.error(), out);
  Arena* a = *ar;
  if (!owner) {
    // Group readers get a read-only fd.
    int fd = read_only_fd(*a);
    if (fd < 0) return reply_err(h, Status::from_errno(errno, "read-only arena fd"), out);
    reply_ok(h, MapArenaRep{a->id(), a->size(), a->node()}, out);
    out.fd = fd;
    return;
  }
  reply_ok(h, MapArenaRep{a->id(), a->size(), a->node()}, out);
  out.fd = a->fd();
}

Result<Arena*> RequestHandler::arena_for(const Session& s, uint64_t id, bool& owner) {
  Pool* p = state_.catalog.find_pool(arena_pool(id));
  Arena* a = p ? state_.ram->arena(id) : nullptr;
  if (!a) return fail(Code::kNotFound, "no arena " + std::to_string(id));
  owner = s.uid == p->owner_uid;
  if (!owner)  // group readers may map it read-only; anyone else is refused
    if (Status st = check_right(creds(s), *p, Right::kRead, state_.admin_gid); !st) return fail(std::move(st));
  return a;
}

void RequestHandler::on_arena_pin(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(ArenaPinReq, req);
  bool owner = false;
  auto a = arena_for(s, req.arena_id, owner);
  if (!a) return reply_err(h, a.error(), out);
  if (req.length == 0 || req.offset > (*a)->size() || req.length > (*a)->size() - req.offset)
    return reply_err(h, Status(Code::kInvalidArgument, "pinned range is empty or outside the arena"), out);
  // Without an NVMe tier nothing is ever punched out of an arena: there is nothing to keep.
  if (state_.tiering) {
    DmaPins& pins = state_.tiering->dma_pins();
    Status st = req.pinned ? pins.add(s.id, req.arena_id, req.offset, req.length)
                           : pins.remove(s.id, req.arena_id, req.offset, req.length);
    if (!st) return reply_err(h, st, out);
  }
  reply_ok(h, Empty{}, out);
}

int RequestHandler::read_only_fd(const Arena& a) {
  auto it = ro_fds_.find(a.id());
  if (it != ro_fds_.end()) return it->second;
  // Reopening through /proc gives a new open file description on the same object, read-only.
  std::string path = "/proc/self/fd/" + std::to_string(a.fd());
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) ro_fds_.emplace(a.id(), fd);
  return fd;
}

void RequestHandler::close_read_only_fds(uint64_t pool_id) {
  auto it = ro_fds_.lower_bound(arena_id(pool_id, 0));
  while (it != ro_fds_.end() && arena_pool(it->first) == pool_id) {
    ::close(it->second);
    it = ro_fds_.erase(it);
  }
}

// --- introspection ---

StatusRep RequestHandler::status() const {
  StatusRep r;
  r.daemon_version = kDaemonVersion;
  r.uptime_ms = ms_since(state_.started);
  r.clients = state_.clients;
  r.pools = static_cast<uint32_t>(state_.catalog.pool_count());
  r.leases = state_.leases.live();
  for (const auto& n : state_.ram->nodes()) r.ram.push_back(NodeTierW{n.node, n.capacity, n.used, 0, n.tensors});
  const Counters& c = state_.counters;
  r.bytes_read = c.bytes_read;
  r.bytes_written = c.bytes_written;
  r.hits = c.hits;
  r.misses = c.misses;
  r.stalls = c.stalls;
  r.evictions = c.evictions;
  r.prefetches = c.prefetches;
  r.requests = c.requests;
  r.errors = c.errors;
  if (state_.tiering) state_.tiering->fill_status(r);
  return r;
}

TopoRep RequestHandler::topo() const {
  TopoRep r;
  r.source = state_.topology.source;
  for (const auto& n : state_.topology.nodes) r.nodes.push_back(TopoNodeW{n.id, n.memory, n.cpus});
  for (const auto& d : state_.topology.gpus) r.gpus.push_back(TopoDevW{d.index, d.name, d.pci, d.numa_node});
  for (const auto& d : state_.topology.nvme) r.nvme.push_back(TopoDevW{d.index, d.name, d.pci, d.numa_node});
  return r;
}

std::string RequestHandler::metrics_text(const Session* viewer) const {
  StatusRep st = status();
  MetricsInput in;
  in.status = &st;
  in.lease_waits = state_.counters.lease_waits;
  in.lease_timeouts = state_.counters.lease_timeouts;
  in.leases_granted = state_.counters.leases_granted;
  in.lease_latency = &lease_latency_;
  in.catalog = &state_.catalog;
  in.arena_repairs = [this](const Pool& p) { return state_.ram->arena_repairs(p.id); };
  if (viewer) in.visible = [&](const Pool& p) { return may_see(creds(*viewer), p, state_.admin_gid); };
  if (state_.tiering) in.nvme_quota = [&](const Pool& p) { return state_.tiering->nvme_quota(p); };
  if (state_.tiering)
    for (const auto& d : state_.tiering->engine().stats().dirs)
      in.nvme_io.push_back({d.path, d.in_flight, d.queue_depth, d.bytes_read, d.bytes_written});
  std::string o = render_metrics(in);
  if (state_.tiering) o += tier_metrics_text();
  return o;
}

std::string RequestHandler::status_line() const {
  return fmt::format("RAM {} of {} used, {} pools, {} clients, {} leases",
                     format_size(state_.ram->used()), format_size(state_.ram->capacity()),
                     state_.catalog.pool_count(), state_.clients, state_.leases.live());
}

void RequestHandler::on_status(Session&, const Header& h, std::span<const std::byte> payload,
                               Reply& out) {
  TIER_DECODE(Empty, req);
  (void)req;
  reply_ok(h, status(), out);
}

void RequestHandler::on_topo(Session&, const Header& h, std::span<const std::byte> payload,
                             Reply& out) {
  TIER_DECODE(Empty, req);
  (void)req;
  reply_ok(h, topo(), out);
}

void RequestHandler::on_metrics(Session& s, const Header& h, std::span<const std::byte> payload,
                                Reply& out) {
  // Pages of at most kMaxStringBytes, cut at line ends; an empty payload asks for page 0.
  MetricsReq req;
  if (!payload.empty()) {
    auto r = decode<MetricsReq>(payload);
    if (!r) return reply_err(h, r.error(), out);
    req = *r;
  }
  TextRep rep;
  rep.text = metrics_page(metrics_text(&s), req.page, kMaxStringBytes, rep.more);
  reply_ok(h, rep, out);
}

void RequestHandler::on_nvme_only(Session&, const Header& h, std::span<const std::byte>,
                                  Reply& out) {
  reply_err(h, Status(Code::kUnsupported, "the NVMe tier is not configured"), out);
}

}  // namespace tier::daemon
