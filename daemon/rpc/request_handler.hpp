// Request dispatch: one control message in, one reply out, as a pure function of the daemon
// state and the session — no socket I/O — so it can be unit-tested and fuzzed in memory.
//
// Malformed input never crashes: a datagram whose header cannot be trusted (short, bad magic,
// bad version, length mismatch, unknown type) closes the connection (Reply::close), after a
// kProtocol reply only when the header is recognisably tierd's (our magic and a known type, e.g.
// another protocol version) so that there is a request id to answer; a body that does not decode
// gets a kProtocol reply and the connection stays. The first message of a
// session must be Hello.
//
// Lease requests that must wait produce no reply now (Reply::deferred); the reply comes later
// through the DeferredSink, when the leases are granted, the deadline passes (kTimeout) or the
// tensors vanish. Not thread-safe: the event loop is the only caller.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "leases/access.hpp"
#include "leases/lease_service.hpp"
#include "core/metrics.hpp"
#include "pools/pool_service.hpp"
#include "leases/session.hpp"
#include "state/state.hpp"
#include "wire/messages.hpp"

namespace tier::daemon {

struct Reply {
  std::vector<std::byte> bytes;  // the encoded reply; empty when deferred
  int fd = -1;                   // an fd to pass with it (borrowed: the arena keeps it open)
  bool close = false;            // close the connection after sending
  bool deferred = false;         // a lease wait: the reply comes through the DeferredSink
  void reset() {
    bytes.clear();
    fd = -1;
    close = false;
    deferred = false;
  }
};

class RequestHandler {
 public:
  using DeferredSink = LeaseService::DeferredSink;

  explicit RequestHandler(DaemonState& state);
  ~RequestHandler();

  void set_deferred_sink(DeferredSink sink) { leases_.set_deferred_sink(std::move(sink)); }
  void set_peer_gone(LeaseService::PeerGone f) { leases_.set_peer_gone(std::move(f)); }
  // Sessions are registered while their connection is open; `s` must outlive the registration.
  void session_opened(Session& s);
  // Releases the session's leases, drops its waiters and retries the others.
  void session_closed(Session& s);
  // The daemon is stopping (SIGTERM): the sessions it closes now keep their write leases
  // journaled as held, since their clients go on writing until they reconnect to the next
  // tierd (daemon/leases/reclaim.hpp).
  void stopping() { state_.leases.on_write_end = nullptr; }

  void handle(Session& s, std::span<const std::byte> datagram, Reply& out);

  // Answers the lease waiters whose deadline passed with kTimeout, and ends the write leases
  // from before a restart whose holder is gone or whose reclaim timeout passed.
  void expire(Clock::time_point now);
  [[nodiscard]] std::optional<Clock::time_point> next_deadline() const;

  // NVMe tier: runs its completions and timers, then answers the lease waiters they unblocked.
  // The server calls it when the tier's event fd is readable and after each batch of events.
  void tier_poll();
  // Snapshots: finishes and feeds them (Durability::poll), then answers the lease waiters
  // their released pins unblocked. An error is the journal's: the server stops.
  [[nodiscard]] Status snapshot_poll();

  [[nodiscard]] wire::StatusRep status() const;
  [[nodiscard]] wire::TopoRep topo() const;
  // Prometheus text exposition of the status counters.
  // `viewer`: only the pools that session may see get per-pool series; null: every pool.
  // The metrics HTTP endpoint's text (no viewer): its per-pool series (pool names, owner uids)
  // only with metrics_http_per_pool, since any local user may read that endpoint.
  [[nodiscard]] std::string http_metrics_text() const;
  [[nodiscard]] std::string metrics_text(const Session* viewer = nullptr) const;
  // One line for systemd's STATUS=.
  [[nodiscard]] std::string status_line() const;

 private:
  using Handler = void (RequestHandler::*)(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_hello(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_pool_create(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_pool_open(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_pool_list(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_pool_drop(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_tensor_create(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_tensor_open(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_tensor_list(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_tensor_delete(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_lease(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_release(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  // LeaseReclaim (request_handler_reclaim.cpp): a write lease from before a restart.
  void on_lease_reclaim(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_map_arena(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_arena_pin(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_status(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_topo(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_metrics(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_nvme_only(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  // Snapshot (request_handler_durability.cpp): deferred until durable.
  void on_snapshot(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_snapshot_take(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  // The pool a snapshot request names, usable by the session; kUnsupported without a journal.
  [[nodiscard]] Result<Pool*> snapshot_pool(const Session& s, const std::string& name);
  void take_snapshot(Session& s, const wire::Header& h, const std::string& pool, uint64_t tag, uint32_t keep,
                     Reply& out);
  void on_snapshot_list(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_snapshot_restore(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  // Deletes unleased `t` of `p`: its tiers, its journal record, its catalog entry.
  void erase_tensor(Pool& p, Tensor& t);
  // NVMe tier requests (request_handler_tiering.cpp); kUnsupported without the tier.
  void on_prefetch(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_evict(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_plan_set(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  void on_discard(Session&, const wire::Header&, std::span<const std::byte>, Reply&);
  // Resolves tensor ids of `pool` for Prefetch/Evict/PlanSet into scratch_tensors_.
  [[nodiscard]] Status resolve_in_pool(const Pool& pool, std::span<const uint64_t> ids);
  [[nodiscard]] std::string tier_metrics_text() const;
  // Pools for which `visible` is true (empty: all) get per-pool series.
  [[nodiscard]] std::string metrics_text(const Session* viewer,
                                         const std::function<bool(const Pool&)>& visible) const;

  template <class T> void reply_ok(const wire::Header& h, const T& body, Reply& out);
  void reply_err(const wire::Header& h, const Status& st, Reply& out);
  void reply_err_raw(uint16_t type, uint32_t request_id, const Status& st, Reply& out);

  [[nodiscard]] bool is_admin(const Session& s) const noexcept;
  [[nodiscard]] Status may_use(const Session& s, const Pool& p) const;
  [[nodiscard]] Status may_inspect(const Session& s, const Pool& p) const;
  // Arena `id` when `s` may map it: its pool's owner (owner = true), or a group reader.
  [[nodiscard]] Result<Arena*> arena_for(const Session& s, uint64_t id, bool& owner);
  [[nodiscard]] Result<Pool*> pool_named(const std::string& name);
  // pool_named() and the check that the session may use (or inspect) it, in one place.
  enum class PoolAccess { kUse, kInspect };
  [[nodiscard]] Result<Pool*> pool_for(const Session& s, const std::string& name, PoolAccess a);

  // A read-only fd of the arena for group readers (opened once, closed when its pool drops).
  [[nodiscard]] int read_only_fd(const Arena& a);
  void close_read_only_fds(uint64_t pool_id);
  // The lease waiters, tried again after something that may unblock them (LeaseService).
  void retry_waiters();

  DaemonState& state_;
  LeaseService leases_;
  PoolService pools_;
  // Decoded requests of the hot path, reused so that lease and release allocate nothing in
  // steady state.
  wire::LeaseReq lease_req_;
  wire::ReleaseReq release_req_;
  wire::LeaseRep lease_rep_;              // LeaseReclaim's reply
  std::vector<Tensor*> scratch_tensors_;  // Prefetch, Evict, Discard
  UidTable uids_;
  std::map<uint64_t, int> ro_fds_;  // arena id -> owned O_RDONLY fd
};

template <class T> void RequestHandler::reply_ok(const wire::Header& h, const T& body, Reply& out) {
  Status st = wire::encode_reply(h.type, h.request_id, Status::ok(), body, out.bytes);
  if (!st) reply_err(h, st, out);
}

}  // namespace tier::daemon
