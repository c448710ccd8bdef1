// LeaseService: grant, wait, retry, release, expire (see lease_service.hpp).
#include "leases/lease_service.hpp"

#include "leases/access.hpp"
#include "durability/durability.hpp"
#include "base/log.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

using namespace tier::wire;

namespace {

constexpr uint16_t kLeaseType = static_cast<uint16_t>(MsgType::kLease);

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

}  // namespace

size_t LeaseService::max_grants() {
  // Grants that fit one LeaseRep, as the codec sizes them: the header, an ok ReplyStatus, the
  // grant vector's count, then one LeaseGrant each (1637). Below wire::kMaxBatch.
  static const size_t n =
      (kMaxMessageBytes - kHeaderBytes - encoded_size(ReplyStatus{}) - encoded_size(LeaseRep{})) /
      encoded_size(LeaseGrant{});
  return n;
}

LeaseService::LeaseService(Parts parts) : parts_(parts), pid_ns_(own_pid_ns()) {}

void LeaseService::session_opened(Session& s) {
  s.leases.session_id = s.id;
  sessions_[s.id] = &s;
}

bool LeaseService::session_closed(Session& s) {
  sessions_.erase(s.id);
  parts_.leases.drop_waiters(s.id);
  if (parts_.tiering) parts_.tiering->session_closed(s.id);
  size_t n = parts_.leases.release_all(s.leases, parts_.catalog);
  if (n > 0) log_debug("session {} (pid {}) closed holding {} leases; released", s.id, s.pid, n);
  return n > 0;
}

LeaseHolder LeaseService::holder_of(const Session& s) const {
  return LeaseHolder{s.uid, s.pid, s.pid_start, pid_ns_};
}

Status LeaseService::resolve(const Session& s, std::span<const uint64_t> ids, LeaseMode mode) {
  scratch_tensors_.clear();
  for (uint64_t id : ids) {
    Tensor* t = parts_.catalog.find_tensor(id);
    if (!t) return Status(Code::kNotFound, "no tensor with id " + std::to_string(id));
    Pool* p = parts_.catalog.find_pool(t->pool_id);
    if (!p) return Status(Code::kInternal, "tensor without a pool");
    if (p->owner_uid != s.uid) {
      Status st = check_right(PeerCreds{s.uid, s.gid, s.groups}, *p,
                              mode == LeaseMode::kRead ? Right::kRead : Right::kUse, parts_.admin_gid);
      if (!st) return st;
    }
    if (!t->ram && !parts_.tiering)
      return Status(Code::kUnsupported,
                    "tensor '" + t->name + "' is not in RAM and the NVMe tier is not configured");
    scratch_tensors_.push_back(t);
  }
  // A running snapshot copies these first; the lease then waits for its pins (durability.hpp).
  if (is_write(mode) && parts_.durable) parts_.durable->copy_before_write(scratch_tensors_);
  return Status::ok();
}

Status LeaseService::overwrite_conflict(LeaseMode mode) const {
  // An overwrite lease places tensors only on NVMe without a read only when it can be granted
  // right after: otherwise the placed, unspecified bytes would sit unleased while it waits. So
  // while a conflicting lease is held it prepares nothing (its bytes are dead: there is nothing
  // worth fetching, and a corrupt NVMe copy must not fail it) and waits like any conflict.
  return mode == LeaseMode::kOverwrite ? parts_.leases.check(mode, scratch_tensors_) : Status::ok();
}

bool LeaseService::snapshot_pinned() const {
  return parts_.durable && parts_.durable->pinned(scratch_tensors_);
}

bool LeaseService::holders_gone(LeaseMode mode) const {
  return peer_gone_ && parts_.leases.conflicts_only_with(mode, scratch_tensors_, peer_gone_);
}

Status LeaseService::grant(Session& s, LeaseMode mode, uint32_t request_id, std::vector<std::byte>& out) {
  scratch_ids_.clear();
  // The grant hands out t->ram; a tensor that left RAM since it was checked would hand out an
  // extent now owned by another tensor (the tier keeps a lease's tensors resident until here).
  for (const Tensor* t : scratch_tensors_)
    if (!t->ram)
      return Status(Code::kInternal, "tensor '" + t->name + "' left RAM before its lease was granted");
  TIER_TRY(parts_.leases.acquire(s.leases, mode, scratch_tensors_, parts_.catalog, scratch_ids_));
  parts_.counters.leases_granted += scratch_ids_.size();
  parts_.counters.hits += scratch_ids_.size();
  if (parts_.durable && is_write(mode)) {
    // The NVMe copy becomes stale, and the lease is journaled: a restarted daemon keeps the
    // extent for this holder (daemon/leases/reclaim.hpp).
    const LeaseHolder holder = holder_of(s);
    for (size_t i = 0; i < scratch_tensors_.size(); ++i) {
      Tensor& t = *scratch_tensors_[i];
      if (t.nvme) parts_.durable->nvme_copy_dropped(t);
      parts_.durable->write_lease_held(t, scratch_ids_[i], holder);
    }
  }
  if (parts_.tiering) parts_.tiering->on_granted(scratch_tensors_, mode);
  lease_rep_.grants.resize(scratch_tensors_.size());
  for (size_t i = 0; i < scratch_tensors_.size(); ++i) {
    const Tensor& t = *scratch_tensors_[i];
    lease_rep_.grants[i] = LeaseGrant{scratch_ids_[i], t.id, t.ram->arena_id, t.ram->offset, t.size};
  }
  Status st = encode_reply(kLeaseType, request_id, Status::ok(), lease_rep_, out);
  if (!st) {
    // Cannot happen: a lease names at most max_grants() tensors. Undo rather than hold
    // unreported leases.
    for (uint64_t id : scratch_ids_) (void)parts_.leases.release(s.leases, id, parts_.catalog);
    return st;
  }
  return Status::ok();
}

void LeaseService::wait(const Session& s, uint32_t request_id, const LeaseReq& req, bool io) {
  Waiter w;
  w.session_id = s.id;
  w.request_id = request_id;
  w.mode = static_cast<LeaseMode>(req.mode);
  w.tensor_ids = req.tensor_ids;
  if (req.timeout_ms > 0) w.deadline = Clock::now() + std::chrono::milliseconds(req.timeout_ms);
  w.io = io;
  w.fail_fast = req.timeout_ms == 0;
  w.since = Clock::now();
  parts_.leases.add_waiter(std::move(w));
}

LeaseService::Outcome LeaseService::request(Session& s, uint32_t request_id, const LeaseReq& req,
                                            std::vector<std::byte>& reply) {
  const uint64_t t_receipt = now_ns();
  if (req.mode < static_cast<uint8_t>(LeaseMode::kRead) || req.mode > kMaxLeaseMode)
    return {Status(Code::kInvalidArgument, "lease mode must be read, write or overwrite")};
  if (req.tensor_ids.empty() || req.tensor_ids.size() > max_grants())
    return {Status(Code::kInvalidArgument, "a lease names 1.." + std::to_string(max_grants()) +
                                               " tensors (the grants must fit one 64 KiB reply)")};
  if (s.leases.count + req.tensor_ids.size() > parts_.config.max_leases_per_client)
    return {Status(Code::kResourceExhausted, "this client holds " + std::to_string(s.leases.count) +
                                                 " leases; the limit is " +
                                                 std::to_string(parts_.config.max_leases_per_client))};
  const LeaseMode mode = static_cast<LeaseMode>(req.mode);
  if (Status st = resolve(s, req.tensor_ids, mode); !st) return {st};
  const Status conflict = overwrite_conflict(mode);
  if (parts_.tiering && conflict.is_ok()) {
    // Tensors only on NVMe are fetched first; the reply waits for them like a lease wait.
    auto must_wait = parts_.tiering->prepare_lease(s.id, scratch_tensors_, mode);
    if (!must_wait) return {must_wait.error()};
    if (*must_wait) {
      wait(s, request_id, req, /*io=*/true);
      return {Status::ok(), true};
    }
  }
  Status st = conflict.is_ok() ? grant(s, mode, request_id, reply) : conflict;
  if (st) {
    latency_.observe(now_ns() - t_receipt);
    return {Status::ok()};
  }
  // A snapshot's pin is not a client's lease: a fail-fast lease waits for it (one tensor copy),
  // and for the leases of clients that hung up (their sessions close in this iteration).
  if (st.code() != Code::kBusy || (req.timeout_ms == 0 && !snapshot_pinned() && !holders_gone(mode)))
    return {st};
  if (s.waiting >= parts_.config.max_waiters_per_client)
    return {Status(Code::kResourceExhausted,
                   "this client has " + std::to_string(s.waiting) + " lease requests waiting; the limit is " +
                       std::to_string(parts_.config.max_waiters_per_client) + " (max_waiters_per_client)")};
  s.waiting++;
  wait(s, request_id, req, /*io=*/false);
  parts_.counters.lease_waits++;
  parts_.counters.stalls++;
  return {Status::ok(), true};
}

Status LeaseService::release(Session& s, std::span<const uint64_t> lease_ids) {
  if (lease_ids.size() > kMaxBatch)
    return Status(Code::kInvalidArgument, "a release names at most " + std::to_string(kMaxBatch) + " leases");
  // All or nothing: every id must be a lease of this session.
  for (uint64_t id : lease_ids) {
    const LeaseTable::Lease* l = parts_.leases.find(id);
    if (!l || l->session_id != s.id)
      return Status(Code::kNotFound, "no lease " + std::to_string(id) + " held by this client");
  }
  size_t released = 0;
  for (uint64_t id : lease_ids)
    if (parts_.leases.release(s.leases, id, parts_.catalog)) ++released;  // a repeated id fails
  if (released > 0 && parts_.leases.waiter_count() > 0) retry_waiters();
  return Status::ok();
}

void LeaseService::retry_waiters() {
  if (parts_.tiering) parts_.tiering->clear_pins();
  parts_.leases.retry_waiters([&](Waiter& w) {
    auto it = sessions_.find(w.session_id);
    if (it == sessions_.end()) return true;
    Session& s = *it->second;
    Status st = resolve(s, w.tensor_ids, w.mode);
    if (st) st = overwrite_conflict(w.mode);  // kBusy: waits below, preparing nothing
    if (st && parts_.tiering) {
      bool ready = false;
      st = parts_.tiering->lease_ready(scratch_tensors_, ready, w.mode);
      if (st && !ready) {
        parts_.tiering->pin(w.tensor_ids);  // fetched tensors stay until the grant
        return false;
      }
    }
    if (st) st = grant(s, w.mode, w.request_id, deferred_buf_);
    if (!st && st.code() == Code::kBusy && (!w.fail_fast || snapshot_pinned() || holders_gone(w.mode))) {
      if (parts_.tiering) parts_.tiering->pin(w.tensor_ids);
      return false;  // still waiting
    }
    if (w.io && parts_.tiering) parts_.tiering->lease_waited(Clock::now() - w.since);
    if (!st) {
      parts_.counters.errors++;
      log_debug("waiting lease {} answered {}", w.request_id, st.to_string());
      (void)encode_reply(kLeaseType, w.request_id, st, Empty{}, deferred_buf_);
    }
    if (!w.io && s.waiting > 0) s.waiting--;
    if (sink_) sink_(w.session_id, deferred_buf_);
    return true;
  });
}

void LeaseService::expire(Clock::time_point now) {
  // A wait that ends at its deadline is the outcome the client asked for (libtier waits in
  // 20 ms slices), so it counts in lease_timeouts, not in errors.
  parts_.leases.expire_waiters(now, [&](Waiter& w) {
    parts_.counters.lease_timeouts++;
    if (auto it = sessions_.find(w.session_id); !w.io && it != sessions_.end() && it->second->waiting > 0)
      it->second->waiting--;
    Status st(Code::kTimeout,
              w.io ? "lease not granted within the timeout: its tensors are still being read from NVMe"
                   : "lease not granted within the timeout: a conflicting lease is still held");
    log_debug("waiting lease {} answered {}", w.request_id, st.to_string());
    (void)encode_reply(kLeaseType, w.request_id, st, Empty{}, deferred_buf_);
    if (sink_) sink_(w.session_id, deferred_buf_);
  });
  if (parts_.reclaims.sweep(reclaim_parts(), now)) retry_waiters();
}

}  // namespace tier::daemon
