// NvmeTier: the NVMe tier inside tierd (daemon/tiering/: nvme_tier.cpp opens it and holds the
// shared helpers, residency.cpp the per-tensor I/O state machine, victims.cpp eviction,
// cleaner.cpp background write-back, lease_path.cpp what leases need, plans.cpp plans and
// prefetch). It owns the nvme::Engine and the per-tensor tiering
// state, and decides (with daemon/tiering/policy) what leaves RAM and what comes back ahead of use.
//
// Placement: a tensor is in RAM (Tensor::ram), on NVMe (Tensor::nvme), or both. Both with
// dirty == false means the NVMe copy equals the RAM copy (a clean copy: the RAM copy may be
// dropped at once). A tensor whose RAM copy has no NVMe copy, or is dirty (a write lease was
// granted since the last write-back), must be written back before it can leave RAM.
//
// Who calls what (all on the event loop thread; nothing here is thread-safe):
//  * RequestHandler: allocate() for creates (makes room by evicting; a create that would have
//    to wait for write-backs makes the tensor in no tier instead), prepare_lease()/lease_ready()
//    around lease grants (a tensor only on NVMe is
//    fetched first; the lease reply is deferred meanwhile), on_granted() (LRU stamps, dirty),
//    forget() before a tensor or pool is deleted, prefetch/evict/set_plan for those requests.
//  * Server: polls event_fd() in its epoll loop and calls RequestHandler::tier_poll(), which
//    calls poll() and retries lease waiters when poll() reports progress.
//
// Engine callbacks only update state (never call back into the handler), so waiting for I/O
// inside a request (engine wait) cannot re-enter the handler.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/catalog.hpp"
#include "core/config.hpp"
#include "core/clock.hpp"
#include "ram/ram_tier.hpp"
#include "nvme/engine.hpp"
#include "policy/eviction.hpp"
#include "policy/plan.hpp"
#include "policy/watermark.hpp"
#include "core/residency_log.hpp"

namespace tier::daemon {

struct TierStats {
  uint64_t hits = 0;        // leased tensors found in RAM
  uint64_t misses = 0;      // leased tensors found only on NVMe, no fetch under way
  uint64_t stalls = 0;      // lease requests that waited for I/O
  uint64_t stall_us = 0;    // their total wait
  uint64_t evictions = 0;   // RAM copies dropped
  uint64_t writebacks = 0;  // completed write-backs (spills)
  uint64_t fetches = 0;     // completed fetches (demand and prefetch)
  uint64_t prefetches = 0;  // fetches started ahead of a lease (Prefetch requests and plans)
  uint64_t fetch_errors = 0, writeback_errors = 0;
  // Leases that got RAM with no read-back: overwrite leases of tensors only on NVMe, and
  // leases of tensors in no tier (discarded and dropped: zero-filled).
  uint64_t fetches_skipped = 0;
  uint64_t discarded_bytes = 0;  // RAM copies a Discard freed from their write-back
  uint64_t cleaned_bytes = 0;    // written back ahead of need while the device was idle
};

class NvmeTier {
 public:
  // Opens the engine on cfg.nvme (logging each directory's backend choice).
  [[nodiscard]] static Result<std::unique_ptr<NvmeTier>> open(const Config& cfg, Catalog& catalog,
                                                              RamTier& ram);
  ~NvmeTier();  // drains I/O in flight (the catalog and RAM tier must still exist)
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Readable when poll() has work (engine completions or a prefetch timer).
  int event_fd() const noexcept { return epfd_; }
  // Runs completions, watermark maintenance and due prefetches. Returns true when something
  // completed that lease waiters may be waiting for.
  bool poll();

  // RAM for a new tensor or a fetch: evicts (starting write-backs where needed) until it fits.
  // Never waits for the device: kBusy when only write-backs in flight can free the room (the
  // caller retries when I/O completes, or does without); kResourceExhausted when nothing more
  // can be evicted (all leased or busy), naming why.
  [[nodiscard]] Result<RamLocation> allocate(Pool& pool, int32_t node, uint64_t size);

  // Admission (daemon/tiering/admission.hpp): kResourceExhausted when a tensor of `size` bytes is larger
  // than `pool`'s NVMe quota or the whole NVMe tier, so it could never leave RAM.
  [[nodiscard]] Status nvme_admits(const Pool& pool, uint64_t size, std::string_view name) const;

  // Before granting a lease on `tensors` to `session`: counts hits and misses, advances the
  // session's plan cursor, starts fetches for tensors only on NVMe. Returns true when the grant
  // must wait for I/O (defer the reply; retry with lease_ready()). For kOverwrite a tensor only
  // on NVMe is given RAM at once and not read (its bytes are dead); one being fetched is waited.
  [[nodiscard]] Result<bool> prepare_lease(uint64_t session, std::span<Tensor* const> tensors,
                                           LeaseMode mode = LeaseMode::kRead);
  // For a waiting lease: ok with ready = true when every tensor is in RAM; restarts fetches of
  // tensors that left RAM again (kOverwrite: places them without a read); an error when a fetch
  // failed (kCorruption, kIo, ...).
  [[nodiscard]] Status lease_ready(std::span<Tensor* const> tensors, bool& ready,
                                   LeaseMode mode = LeaseMode::kRead);
  // A waiting lease was answered after `waited` (stall time).
  void lease_waited(Clock::duration waited);
  // A lease on `tensors` was granted: LRU stamps; a write lease makes the RAM copy dirty.
  void on_granted(std::span<Tensor* const> tensors, LeaseMode mode);
  // Tensors of waiting leases: never chosen as eviction victims. clear_pins() starts a new set.
  void clear_pins() { pinned_.clear(); }
  void pin(std::span<const uint64_t> ids) { pinned_.insert(ids.begin(), ids.end()); }

  // The client no longer needs the bytes of `tensors` (Discard): their contents are
  // unspecified until the next write, and no write-back is spent on them. A dirty RAM copy
  // whose tensor has an intact older NVMe copy becomes clean: eviction drops it for free and
  // the tensor then reads as that older copy (journaled again, so a restart finds the same
  // fallback). A RAM copy with no NVMe copy to fall back on is marked dead: eviction drops it
  // without writing it, and the tensor, then in no tier, reads as zeros (after a restart too).
  // Until it leaves RAM it reads as its current bytes. Left as they are: a tensor under a write
  // lease (the write happens after the discard), with I/O in flight, or whose NVMe copy may be
  // torn. A write lease ends the dead state. A hint: never an error.
  void discard(std::span<Tensor* const> tensors);

  // A restore (Durability::restore_snapshot) is about to overwrite every byte of unleased `t`:
  // waits for its I/O, gives it RAM without reading its NVMe copy when it has none (evicting
  // others, and waiting for their write-backs when only those can make room), and marks the
  // RAM copy dirty as a write lease does (the caller journals the NVMe copy as dropped).
  // Returns where its bytes go. kResourceExhausted when no room can be made.
  [[nodiscard]] Result<std::byte*> place_for_restore(Pool& pool, Tensor& t);

  // Before `t` is erased: waits for its I/O and frees its NVMe copy. The caller frees its RAM.
  void forget(Pool& pool, Tensor& t);

  // Starts fetches of `tensors` not in RAM (asynchronous). Errors when RAM cannot be found.
  [[nodiscard]] Status prefetch(Pool& pool, std::span<Tensor* const> tensors);
  // Writes back (when needed) and drops from RAM; waits for the write-backs. Leased tensors are
  // skipped and counted in `skipped`.
  [[nodiscard]] Status evict(Pool& pool, std::span<Tensor* const> tensors, size_t& skipped);
  // Registers (replaces; empty ids: removes) the session's plan over tensors of `pool`.
  // `overwrite`: empty, or one flag per use (1: the use overwrites the tensor, see PlanIndex).
  [[nodiscard]] Status set_plan(uint64_t session, Pool& pool, std::vector<uint64_t> ids, uint64_t budget,
                                std::vector<uint8_t> overwrite = {});
  void session_closed(uint64_t session);

  // The tier's figures for status and metrics (the request handler puts them on the wire).
  struct Figures {
    struct Dir {
      std::string path;
      int32_t numa_node = -1;
      std::string backend;
      uint64_t capacity = 0, used = 0;
    };
    std::vector<Dir> dirs;
    std::unordered_map<int32_t, uint64_t> dirty_by_node;  // RAM bytes that need a write-back
    uint64_t bytes_read = 0, bytes_written = 0;           // fetched from / written to NVMe
  };
  [[nodiscard]] Figures figures() const;
  const TierStats& stats() const noexcept { return stats_; }
  const nvme::Engine& engine() const noexcept { return *engine_; }

  // Where RAM placements, drops and completed NVMe copies are reported (the journal, through
  // daemon/core/residency_log.hpp). Null: nothing is journaled (tests).
  void set_residency_log(ResidencyLog* log) noexcept { durable_ = log; }
  // After a restart rebuilt the catalog: marks every journaled NVMe copy's extents used. A copy
  // whose extents the engine refuses is dropped (journaled) and logged.
  [[nodiscard]] Status adopt_catalog();

  // The NVMe quota that applies to `p`: its own, or the default (nvme_pool_quota) for 0.
  [[nodiscard]] uint64_t nvme_quota(const Pool& p) const;
  // nvme_pool_quota, resolved against the tier: the quota of a pool created without one.
  [[nodiscard]] uint64_t default_nvme_quota() const noexcept { return default_nvme_quota_; }
  [[nodiscard]] uint64_t nvme_capacity() const noexcept { return nvme_capacity_; }

 private:
  enum class Io : uint8_t { kNone, kFetch, kSpill };
  struct TensorIo {
    uint64_t last_use = 0;   // LRU stamp
    uint64_t write_gen = 0;  // bumped by each write lease
    uint64_t spill_gen = 0;  // write_gen when the write-back in flight started
    Io io = Io::kNone;
    bool drop_after = false;        // drop the RAM copy when the write-back completes
    RamLocation pending;            // RAM being filled by the fetch in flight
    std::optional<Status> error;    // the last fetch's failure, until the next fetch starts
    double spill_failed_at = -1e9;  // when its last write-back failed: not retried for a while
    Status spill_error;             // and why
    // Evicted to make room in its own pool's arena on its own node: the extent is reused at
    // once, so its pages stay (punching them would only have the reuse fault in zeroed pages).
    bool keep_pages = false;
    // Tensor::nvme was written while a write lease was granted: its bytes may be torn (and it
    // is journaled as dropped). Such a copy is no fallback for discard().
    bool torn_copy = false;
    // Discarded with no NVMe copy: its bytes are not worth a write-back (see discard()).
    // Cleared by a write lease and when the RAM copy goes; not journaled (a restart forgets
    // the hint, and the tensor is written back again if evicted).
    bool dead = false;
    // Named by a Discard at least once: its client discards it (eviction holds it, dirty and
    // overwritten next, for the discard rather than writing it back: policy/eviction.hpp).
    bool discarded_before = false;
    // NVMe quota bytes of pool spill_pool the write-back in flight holds (see nvme_spilling_).
    uint64_t spill_pool = 0, spill_reserved = 0;
    bool cleaning = false;  // the write-back in flight is a background one (cleaned_bytes)
  };
  struct Plan {
    uint64_t pool_id = 0;
    policy::PlanIndex index;
    uint64_t budget = 0;
    uint64_t cursor = 0;
    double last_advance = 0;     // seconds (steady clock)
    double seconds_per_use = 0;  // moving average of the time between uses
  };

  NvmeTier(Catalog& c, RamTier& r) : catalog_(c), ram_(r) {}
  TensorIo& ts(uint64_t id);
  std::byte* ram_ptr(const RamLocation& loc);
  // Frees a RAM extent and punches its pages out of the arena.
  void release_ram(Pool& pool, const RamLocation& loc, bool punch = true);
  // Fixed-buffer mode: re-registers the arenas with io_uring when they changed (an arena was
  // mapped or unmapped), after draining the I/O in flight. Called before any I/O is submitted,
  // so no request can reach memory through a stale registration.
  void ensure_registration();
  // Drops clean, unleased RAM copies: journals every drop and commits once (one fdatasync),
  // then frees the extents and returns their pages to the OS (unless keep_pages).
  void drop_ram_many(std::span<Tensor* const> tensors);
  // Reads and clears TensorIo::keep_pages.
  bool take_keep_pages(uint64_t id);
  // Drops the tensors whose write-back completed (spill_done queues them) and that are still
  // clean and unleased: one commit per batch of completions. Called after every engine poll or
  // wait, before anything looks at RAM usage again.
  void flush_drops();
  // Leaving RAM costs a write-back: newer than its NVMe copy, or no copy there, unless dead.
  [[nodiscard]] bool needs_writeback(const Tensor& t) const;
  [[nodiscard]] bool evictable(const Tensor& t) const;
  // Moves unleased tensors of `pool`'s arena on `node` so that a free range of `size` bytes
  // exists there (daemon/tiering/compact.cpp); true when it made one.
  [[nodiscard]] bool compact(Pool& pool, int32_t node, uint64_t size);
  // One packing pass over `pool`'s tensors in `arena`; returns how many moved (their bytes
  // added to `bytes`).
  uint64_t pack(Pool& pool, uint64_t arena, bool keep_alignment, uint64_t& bytes);
  // The RAM tier's usage of `node`, or null when it has no RAM tier there.
  [[nodiscard]] const NodeUsage* node_usage(int32_t node) const;
  // A prefetch's use: `uses` ahead in a plan advancing every `seconds_per_use` (0: unknown).
  struct Ahead {
    uint64_t uses = 0;
    double seconds_per_use = 0;
  };
  // demand = false: a prefetch for the use `ahead`; it evicts only clean tensors used later.
  [[nodiscard]] Status start_fetch(Pool& pool, Tensor& t, bool demand, std::optional<Ahead> ahead);
  [[nodiscard]] Status start_spill(Pool& pool, Tensor& t, bool drop_after);
  [[nodiscard]] Result<bool> prepare_lease_impl(uint64_t session, std::span<Tensor* const> tensors,
                                                LeaseMode mode);
  [[nodiscard]] Status lease_ready_impl(std::span<Tensor* const> tensors, bool& ready, LeaseMode mode);
  // For a lease: a tensor in no tier (discarded, then dropped) gets zero-filled RAM now when
  // there is room; while write-backs free some it stays without (ok, not kBusy).
  [[nodiscard]] Status fill_if_in_no_tier(Pool& pool, Tensor& t);
  // Gives every tensor of an overwrite lease that is only on NVMe (no I/O in flight) a RAM
  // extent without reading its bytes, all or none: journaled as placed and dirty (the NVMe copy
  // is stale once the write lease is granted). kBusy when the room needs write-backs to end.
  [[nodiscard]] Status place_for_overwrite(std::span<Tensor* const> tensors);
  [[nodiscard]] bool may_place_for_overwrite(std::span<Tensor* const> tensors, LeaseMode mode);
  void fetch_done(uint64_t id, const Status& st);
  void spill_done(uint64_t id, Result<nvme::NvmeLocation> r);
  void wait_idle(uint64_t id);
  // Every session's plan over the pool, with its cursor.
  std::vector<policy::PlanAt> plans_for_pool(uint64_t pool_id) const;
  // Eviction candidates among RAM-resident tensors; `pool`/`node` restrict them when set;
  // `protect` keeps planned tensors used no later than that use (in each pool's distance unit).
  // Candidates of every pool `uid` owns (its uid_ram_quota is what is short).
  std::vector<policy::Candidate> candidates_of_uid(uid_t uid);
  std::vector<policy::Candidate> candidates(std::optional<uint64_t> pool, std::optional<int32_t> node,
                                            std::optional<Ahead> protect);
  // Victims whose write-back NVMe space refused (the tier or their pool's NVMe quota is full).
  struct NvmeShort {
    uint64_t bytes = 0;                // NVMe bytes their write-backs need
    uint64_t ram_bytes = 0;            // RAM they would free
    const Pool* quota_pool = nullptr;  // set when a pool's NVMe quota (not the tier) refused one
  };
  // Evicts in policy order until `need` bytes are freed or under way. Returns bytes freed now;
  // `started` gets the bytes whose write-back started. `for_pool`/`for_node`: the allocation
  // the room is for; victims in that pool's arena on that node keep their pages (keep_pages).
  // `short_of`: adds the victims refused for NVMe space.
  uint64_t evict_some(std::span<const policy::Candidate> cands, uint64_t need, uint64_t& started,
                      Status& last_error, std::optional<uint64_t> for_pool = std::nullopt,
                      int32_t for_node = -1, NvmeShort* short_of = nullptr);
  // A failed write-back of `s` is not retried for kSpillRetryS, so an allocation that cannot
  // evict fails instead of retrying the same victim forever; one refused for NVMe space is
  // retried as soon as NVMe space was freed since (forget()).
  [[nodiscard]] bool spill_backed_off(const TensorIo& s, double now) const;
  // "NVMe tier full: N free, M needed for the victims' write-backs" (or the pool's NVMe quota).
  [[nodiscard]] std::string nvme_short_message(const NvmeShort& sh) const;
  void maintain();
  // Background write-back: when no I/O is in flight, writes back (without dropping) the dirty,
  // idle RAM copy of a planned tensor whose next read is farthest, while such copies exceed
  // dirty_background_ of their node's RAM tier or of their pool's RAM quota. One at a time, so a demand fetch
  // queues behind at most one write. Called by poll(), i.e. after every request and I/O completion.
  void clean_ahead();
  // Arms the timerfd for the earlier of the next prefetch start and a skipped cleaning scan.
  void arm_timer();
  void schedule_prefetch();

  Catalog& catalog_;
  RamTier& ram_;
  policy::Watermarks marks_;
  uint64_t default_nvme_quota_ = 0;
  std::unordered_map<uint64_t, TensorIo> ts_;
  std::unordered_map<uint64_t, Plan> plans_;  // by session
  std::unordered_set<uint64_t> pinned_;
  // The tensors of the lease prepare_lease()/lease_ready() is deciding on: never victims while
  // it runs (a fetch or prefetch it starts may evict), so a tensor it found in RAM is still
  // there when the caller grants the lease.
  std::unordered_set<uint64_t> leasing_;
  uint64_t tick_ = 1;
  uint64_t writeback_pending_bytes_ = 0;  // RAM bytes whose drop waits on a write-back
  // Per pool id: NVMe bytes of write-backs in flight. Pool::nvme_used counts a copy only once
  // it is durable, so the quota check adds these, or concurrent write-backs would overrun it.
  std::unordered_map<uint64_t, uint64_t> nvme_spilling_;
  double dirty_background_ = 1.0;  // Config::ram_dirty_background
  double next_clean_scan_ = 0;     // clean_ahead() without a completion: not before
  double clean_due_ = std::numeric_limits<double>::infinity();  // a skipped scan's timer
  std::vector<uint64_t> pending_drops_;                         // written back, to drop at flush_drops()
  // Arenas are io_uring fixed buffers (prefault = true): their pages are pinned by the kernel, so
  // they are never punched (a punched page would be replaced in the file while I/O kept using
  // the pinned old one). Off for sparse arenas: pinning would populate them whole.
  bool fixed_buffers_ = false;
  uint64_t registered_generation_ = UINT64_MAX;
  Status last_spill_error_;      // the last failed write-back (named in allocation errors)
  double nvme_freed_at_ = -1e9;  // when an NVMe copy was last freed (spill_backed_off())
  uint64_t nvme_capacity_ = 0;   // the NVMe tier's bytes (fixed at open)
  bool progress_ = false;
  double next_prefetch_ = 0;  // when schedule_prefetch() is due again (0: now)
  int epfd_ = -1, timer_fd_ = -1;
  TierStats stats_;
  ResidencyLog* durable_ = nullptr;
  std::unique_ptr<nvme::Engine> engine_;  // last: destroyed (drained) first
};

}  // namespace tier::daemon
