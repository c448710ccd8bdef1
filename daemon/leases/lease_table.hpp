// The lease table: read leases are shared, write leases exclusive; a batch is granted whole or
// not at all; every lease belongs to one session and dies with it.
//
// Leases live in a slab (vector + free list) and a session's leases form an intrusive list
// threaded through the slab, so granting and releasing allocate nothing in steady state.
// A lease id is (generation << 32 | slot): a stale id never names a newer lease in the slot.
// The per-tensor counts (Tensor::readers / writer) are the conflict state.
//
// Waiters: a batch that conflicts and may wait is queued with its deadline; callers retry the
// queue (in FIFO order) after anything that releases leases, and expire it on a timer.
// Not thread-safe: owned by the daemon's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/catalog.hpp"
#include "core/clock.hpp"
#include "tier/status.hpp"
#include "tier/types.hpp"

namespace tier::daemon {

// A session's leases, kept in the session.
struct SessionLeases {
  uint64_t session_id = 0;
  uint32_t head = UINT32_MAX;  // first slot of the session's list
  uint32_t count = 0;
};

struct Waiter {
  uint64_t session_id = 0;
  uint32_t request_id = 0;
  LeaseMode mode = LeaseMode::kRead;
  std::vector<uint64_t> tensor_ids;
  Clock::time_point deadline = Clock::time_point::max();  // max: wait forever
  // NVMe tier: the batch waits for fetches (not only for a conflict); fail_fast: once fetched,
  // a conflict answers kBusy instead of waiting (timeout_ms == 0); since: when it started.
  bool io = false;
  bool fail_fast = false;
  Clock::time_point since{};
};

class LeaseTable {
 public:
  struct Lease {
    uint64_t tensor_id = 0;
    uint64_t pool_id = 0;
    uint64_t session_id = 0;
    LeaseMode mode = LeaseMode::kRead;
  };

  // Whether `tensors` could all be leased in `mode` now (counts already-held leases of every
  // session, including the asker's). A write batch naming one tensor twice never can.
  [[nodiscard]] Status check(LeaseMode mode, std::span<Tensor* const> tensors) const;
  // check() then grant: appends one lease id per tensor to `ids_out`, in order.
  [[nodiscard]] Status acquire(SessionLeases& s, LeaseMode mode, std::span<Tensor* const> tensors,
                               Catalog& catalog, std::vector<uint64_t>& ids_out);
  // Releases one lease of `s`. kNotFound when `s` does not hold `lease_id`.
  [[nodiscard]] Status release(SessionLeases& s, uint64_t lease_id, Catalog& catalog);
  // Releases every lease of `s`; returns how many.
  size_t release_all(SessionLeases& s, Catalog& catalog);
  // Moves lease `lease_id` of `from` to `to` unchanged (same tensor and mode, no conflict
  // state touched); returns its new id (the old one is stale from then on). kNotFound when
  // `from` does not hold it.
  [[nodiscard]] Result<uint64_t> transfer(SessionLeases& from, SessionLeases& to, uint64_t lease_id);
  // Called with every write lease as it ends (release, release_all), before the tensor's
  // writer flag is cleared; not for transfer(). The daemon journals the end (lease_reclaim.hpp).
  std::function<void(const Lease&)> on_write_end;
  // Whether every lease that keeps `tensors` from being leased in `mode` belongs to a session
  // for which `gone(session_id)` is true (and at least one does). A tensor whose conflict no
  // live lease explains (a write lease from before a restart, daemon/leases/reclaim.hpp) makes it
  // false. Scans every live lease: for the conflict path only.
  [[nodiscard]] bool conflicts_only_with(LeaseMode mode, std::span<Tensor* const> tensors,
                                         const std::function<bool(uint64_t)>& gone) const;
  // The live lease or nullptr.
  [[nodiscard]] const Lease* find(uint64_t lease_id) const noexcept;
  uint64_t live() const noexcept { return live_; }

  // --- waiters ---
  void add_waiter(Waiter w) { waiters_.push_back(std::move(w)); }
  // Removes the waiters of a session (it closed).
  void drop_waiters(uint64_t session_id);
  // Calls `try_grant(waiter)` for each waiter in FIFO order; a waiter for which it returns true
  // (granted or answered with an error) is removed.
  template <class F> void retry_waiters(F&& try_grant) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (try_grant(*it)) it = waiters_.erase(it);
      else ++it;
    }
  }
  // Removes the waiters whose deadline is <= now, calling `on_timeout(waiter)` for each.
  template <class F> void expire_waiters(Clock::time_point now, F&& on_timeout) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline <= now) {
        on_timeout(*it);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  [[nodiscard]] std::optional<Clock::time_point> next_deadline() const noexcept;
  size_t waiter_count() const noexcept { return waiters_.size(); }

 private:
  struct Slot {
    Lease lease;
    uint32_t gen = 0;
    bool live = false;
    uint32_t prev = UINT32_MAX, next = UINT32_MAX;  // session list, or free list via next
  };
  void unlink_slot(SessionLeases& s, uint32_t idx, Catalog& catalog);
  // Takes `idx` off `s`'s list / puts it at the head of `s`'s list (counts only).
  void detach(SessionLeases& s, uint32_t idx);
  void link(SessionLeases& s, uint32_t idx);

  std::vector<Slot> slots_;
  mutable std::vector<const Tensor*> dup_scratch_;  // check(): duplicate detection of big batches
  uint32_t free_head_ = UINT32_MAX;
  uint64_t live_ = 0;
  std::deque<Waiter> waiters_;
};

}  // namespace tier::daemon
