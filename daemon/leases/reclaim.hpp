// Write leases across a daemon restart (docs/daemon.md, "Leases across a restart").
//
// A client holding a write lease keeps storing into its mapping of the arena while tierd is
// down: the shared-memory object outlives the daemon and the client's mapping outlives its
// connection. So every write lease is journaled (WriteLeaseHeld at grant, WriteLeaseEnded when
// it ends), and a restarted daemon turns each one still held into an *orphan* lease: a real
// write lease in the LeaseTable under no session. Its tensor is therefore, like any write-leased
// tensor, never evicted, written back, snapshotted, deleted or leased by anyone else, and its
// RAM extent stays allocated; it is marked dirty (its bytes are whatever the writer stored).
//
// An orphan ends in one of three ways:
//   - its holder reconnects and reclaims it (LeaseReclaim naming the old lease id, from the
//     same uid and, where tierd can tell, the same process): it becomes that session's lease,
//     at the same place, under a new id;
//   - its holder is known gone: the process no longer exists, its pid now names a process
//     started at another time (pid reuse), or it no longer maps the arena for writing. Checked
//     at recovery and every kRecheck after, only when tierd runs in the pid namespace the
//     holder was seen from (elsewhere a pid means nothing: only the timeout applies);
//   - the reclaim timeout (Config::lease_reclaim_timeout_ms after the restart) passes.
// In the last two cases the lease is lost: WriteLeaseEnded is journaled, the tensor stays dirty
// with the bytes the writer left (as when a client dies holding a write lease), and a later
// reclaim is answered kUnavailable naming why.
//
// Not thread-safe: owned by the daemon's event loop.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/lease_holder.hpp"
#include "leases/lease_table.hpp"
#include "tier/status.hpp"

namespace tier::daemon {

class Durability;
class RamTier;

// The start time of `pid` (clock ticks after boot), 0 when it cannot be read.
[[nodiscard]] uint64_t process_start_time(pid_t pid);
// The inode of this process's pid namespace (0 when unknown).
[[nodiscard]] uint64_t own_pid_ns();

enum class Liveness { kAlive, kGone, kUnknown };
// Whether the holder still exists and maps the object (dev, ino) writable. kUnknown when
// tierd cannot tell (another pid namespace, pid 0, /proc not readable).
[[nodiscard]] Liveness holder_liveness(const LeaseHolder& h, dev_t dev, ino_t ino);

class ReclaimTable {
 public:
  // What the table works on: the catalog, the lease table its orphans are held in, the RAM
  // tier (a live holder still maps its tensor's arena; null: none) and the reclaim timeout.
  struct Parts {
    Catalog& catalog;
    LeaseTable& leases;
    RamTier* ram = nullptr;
    uint32_t timeout_ms = 0;  // Config::lease_reclaim_timeout_ms
  };

  // Holders are checked for liveness this often while orphans remain.
  static constexpr Clock::duration kRecheck = std::chrono::seconds(1);

  // Recovery (after the catalog is rebuilt): every write lease the journal says is held becomes
  // an orphan, or is ended at once (journaled) when its tensor has no RAM copy in an arena that
  // survived (a reboot: the holder's mapping is of an object that is gone) or its holder is gone.
  void adopt(const Parts& st, Durability& d, Clock::time_point now);

  // Hands orphan `lease_id` on `tensor_id` to session `s` if `who` is its holder; returns the
  // new lease id. kUnavailable naming why when the lease was lost, kNotFound when tierd never
  // knew it, kPermissionDenied for another uid or process.
  [[nodiscard]] Result<uint64_t> reclaim(const Parts& st, SessionLeases& s, const LeaseHolder& who,
                                         uint64_t tensor_id, uint64_t lease_id);

  // Ends the orphans whose holder is gone or whose deadline passed; true when any ended (the
  // caller retries its lease waiters).
  bool sweep(const Parts& st, Clock::time_point now);
  // When sweep() has work next; nullopt without orphans.
  [[nodiscard]] std::optional<Clock::time_point> next_check() const noexcept;

  size_t orphans() const noexcept { return orphans_.size(); }

  // The session id orphan leases are held under (no real session has it).
  static constexpr uint64_t kOrphanSession = 0;

 private:
  struct Orphan {
    uint64_t old_lease_id = 0;  // the id the previous daemon granted (the holder names it)
    uint64_t lease_id = 0;      // the orphan lease in the LeaseTable
    LeaseHolder holder;
    Clock::time_point deadline;
  };
  void end(const Parts& st, uint64_t tensor_id, uint64_t old_lease_id, std::string why);
  [[nodiscard]] Liveness liveness(const Parts& st, uint64_t tensor_id, const LeaseHolder& h);

  SessionLeases session_{kOrphanSession};
  std::unordered_map<uint64_t, Orphan> orphans_;  // by tensor id
  // Why each lost lease was lost, by tensor id (the old lease id and the reason), for the
  // holder's reclaim; an entry goes when the holder asks (bounded by the leases held at the
  // restart).
  struct Lost {
    uint64_t old_lease_id;
    uid_t uid;  // the holder's: nobody else learns that it was lost, or why
    std::string why;
  };
  std::unordered_map<uint64_t, Lost> lost_;
  Clock::time_point next_recheck_{};
};

}  // namespace tier::daemon
