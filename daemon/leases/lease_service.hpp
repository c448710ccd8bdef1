// LeaseService: the lease hot path behind the Lease and Release messages. It resolves and
// authorizes the tensors a lease names, grants it, or parks it as a waiter (a conflicting lease
// is held, or its tensors are being read from NVMe), retries the waiters when something that
// blocked them ends, and answers the ones whose deadline passed.
//
// The request handler decodes and encodes; this class decides. Replies to waiters go through
// the DeferredSink, never through the handler. Not thread-safe: the event loop is the only
// caller. Sessions register while their connection is open and must outlive the registration.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/catalog.hpp"
#include "core/config.hpp"
#include "core/counters.hpp"
#include "leases/lease_table.hpp"
#include "leases/reclaim.hpp"
#include "ram/ram_tier.hpp"
#include "tiering/nvme_tier.hpp"
#include "core/metrics.hpp"
#include "leases/session.hpp"
#include "wire/messages.hpp"

namespace tier::daemon {

class Durability;

class LeaseService {
 public:
  using DeferredSink = std::function<void(uint64_t session_id, std::span<const std::byte> reply)>;

  // The most tensors one lease may name: the grants must fit one reply (docs/daemon.md).
  static size_t max_grants();

  // What the service works on, owned by the daemon and outliving it. The tiers and durability
  // are named through their owners' pointers: they may come later (open_durability) or never
  // (null: RAM only, no state dir).
  struct Parts {
    const Config& config;
    Catalog& catalog;
    LeaseTable& leases;
    ReclaimTable& reclaims;
    Counters& counters;
    const gid_t& admin_gid;
    const std::unique_ptr<RamTier>& ram;
    const std::unique_ptr<Durability>& durable;
    const std::unique_ptr<NvmeTier>& tiering;
  };

  explicit LeaseService(Parts parts);

  void set_deferred_sink(DeferredSink sink) { sink_ = std::move(sink); }
  // Whether a session's client has hung up though the server has not closed the session yet
  // (its hang-up is pending). A fail-fast lease that conflicts only with leases of such
  // sessions waits for them to close instead of answering kBusy: a job killed and restarted at
  // once must find its tensors free. The server closes such a session soon after saying so.
  using PeerGone = std::function<bool(uint64_t session_id)>;
  void set_peer_gone(PeerGone f) { peer_gone_ = std::move(f); }
  const DeferredSink& deferred_sink() const noexcept { return sink_; }

  void session_opened(Session& s);
  // Drops the session's waiters and releases its leases; true when it held any (the caller
  // then retries the other waiters).
  [[nodiscard]] bool session_closed(Session& s);

  // What a lease request came to: granted (the encoded LeaseRep is in the caller's buffer),
  // deferred (a waiter now answers through the sink later), or refused with `status`.
  struct Outcome {
    Status status;
    bool deferred = false;
  };
  // `req` is a decoded Lease request of `s`; on a grant the reply for `request_id` is encoded
  // into `reply`.
  [[nodiscard]] Outcome request(Session& s, uint32_t request_id, const wire::LeaseReq& req,
                                std::vector<std::byte>& reply);
  // Releases all of `lease_ids` (each must be a lease of `s`: all or nothing), then retries
  // the waiters.
  [[nodiscard]] Status release(Session& s, std::span<const uint64_t> lease_ids);

  // Tries every waiter again, in arrival order; grants what it can, answers what failed.
  void retry_waiters();
  // Answers the waiters whose deadline passed with kTimeout, and ends the write leases from
  // before a restart whose holder is gone or whose reclaim timeout passed.
  void expire(Clock::time_point now);

  // Who holds a lease granted to `s` now, as the journal records it.
  [[nodiscard]] LeaseHolder holder_of(const Session& s) const;
  const LatencyHistogram& latency() const noexcept { return latency_; }

 private:
  [[nodiscard]] ReclaimTable::Parts reclaim_parts() const {
    return {parts_.catalog, parts_.leases, parts_.ram.get(), parts_.config.lease_reclaim_timeout_ms};
  }
  // Resolves and authorizes tensor ids into scratch_tensors_.
  [[nodiscard]] Status resolve(const Session& s, std::span<const uint64_t> ids, LeaseMode mode);
  // For an overwrite lease on scratch_tensors_: the conflicting lease it must wait for (kBusy),
  // during which nothing is fetched or placed for it; ok for other modes.
  [[nodiscard]] Status overwrite_conflict(LeaseMode mode) const;
  // Grants scratch_tensors_ and encodes the LeaseRep into `out`.
  [[nodiscard]] Status grant(Session& s, LeaseMode mode, uint32_t request_id, std::vector<std::byte>& out);
  // Parks the request as a waiter: `io` for an NVMe fetch, otherwise a conflicting lease.
  void wait(const Session& s, uint32_t request_id, const wire::LeaseReq& req, bool io);
  // Whether a running snapshot pins one of scratch_tensors_ while it copies it.
  [[nodiscard]] bool snapshot_pinned() const;
  // Whether every lease that conflicts with scratch_tensors_ in `mode` is held by a session
  // whose client is gone (PeerGone).
  [[nodiscard]] bool holders_gone(LeaseMode mode) const;

  Parts parts_;
  DeferredSink sink_;
  PeerGone peer_gone_;
  std::unordered_map<uint64_t, Session*> sessions_;
  // Hot-path scratch, reused so that lease and release allocate nothing in steady state.
  std::vector<Tensor*> scratch_tensors_;
  std::vector<uint64_t> scratch_ids_;
  std::vector<std::byte> deferred_buf_;
  wire::LeaseRep lease_rep_;
  LatencyHistogram latency_;
  uint64_t pid_ns_ = 0;  // tierd's pid namespace (lease holders' pids mean it)
};

}  // namespace tier::daemon
