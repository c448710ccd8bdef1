// Durability: tierd's catalog journal, restart recovery and pool snapshots (docs/daemon.md,
// "Durability"; the journal format is docs/journal.md).
//
// Journal: every catalog change is appended to <state-dir>/journal/catalog.journal as it is
// made (the record* methods, called by the request handler and the NVMe tier right after the
// in-memory change). An identical CatalogImage is kept beside the catalog: it checks that each
// record makes sense and is what compaction writes. Group commit: the server calls commit()
// once per event-loop iteration and only then sends the replies of requests that appended
// records (Durability::last_seq() moved while they were handled): a create or drop is on disk
// before it is acknowledged. A failed commit means the journal cannot say what reached the disk:
// the server stops (exit 1) rather than acknowledge anything more.
//
// Recovery (open()): replays the journal into the image, rebuilds pools and tensors with their
// journaled ids, re-attaches each journaled arena by name (its bytes intact) and re-marks the
// journaled extents used. Only an object that proves to be tierd's own is re-attached
// (Arena::attach: its random name, owner, mode, size). An arena that is gone (a reboot) or
// refused (a squatter's object, or one a tenant truncated) is created empty under a new name
// (journaled) and its tensors are restored from the pool's latest durable snapshot; tensors neither in the
// snapshot nor with a journaled NVMe copy are lost: deleted from the catalog (journaled), counted and logged.
// Arena objects of this state dir that the journal does not name are removed.
//
// Snapshots (docs/daemon.md "Snapshots"): a snapshot is the point-in-time image of every
// tensor of the pool whatever tier it is on (RAM, NVMe only, or in no tier: zeros), streamed to
// <state-dir>/snapshots/<pool>/<id>/{data,manifest} by a SnapshotWriter thread in bounded
// chunks while the loop keeps serving. Consistency: it starts only when no write lease is held
// on the pool (kBusy otherwise); from then on no tensor of that point is written before it is
// copied. The loop hands the writer a few tensors at a time (kSnapshotWindow bytes, at most
// kSnapshotWindowTensors) and pins
// each one while it is copied (a read pin: Tensor::readers, so it is neither evicted, deleted
// nor write-leased meanwhile); a write lease on a tensor not copied yet (copy_before_write(),
// called by the lease path) hands it to the writer first and waits like any conflicting lease
// until its pin goes. Tensors created after the point are not in it; tensors deleted before
// they are copied are left out (the journal no longer has them, so no restore asks for them).
// Eviction and fetches meanwhile only move unchanged bytes, so a tensor is copied from wherever
// it is when its turn comes. poll() (event_fd() readable) releases pins, feeds the writer, and
// once the manifest and directories are fsynced journals SnapshotDurable, commits, answers the
// request and removes the pool's older snapshots.
//
// Start-up (open()): snapshot directories the journal does not record as durable (a snapshot
// that was being written when tierd died: no manifest, or no SnapshotDurable) and those the
// journal dropped are removed; every directory under the state dir that
// tierd made is mode 0700.
//
// Thread-safety: everything runs on the event-loop thread except the snapshot writers
// (snapshot_writer.hpp), which touch only their own files and buffer.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "journal/catalog_image.hpp"
#include "journal/journal.hpp"
#include "core/residency_log.hpp"
#include "durability/snapshot_writer.hpp"
#include "durability/state_space.hpp"
#include "tier/status.hpp"

namespace tier::nvme {
class Engine;
struct NvmeLocation;
}  // namespace tier::nvme

namespace tier::daemon {

class Catalog;
class RamTier;
struct LeaseHolder;
struct Pool;
struct Tensor;

// The journal record of a pool as it is now (name, owner, quotas, group read access).
[[nodiscard]] journal::PoolCreated pool_record(const Pool& p);
// The journal record of a tensor as it is now (with its RAM placement, when it has one): what
// a create journals and what a snapshot's manifest holds per tensor.
[[nodiscard]] journal::TensorCreated tensor_record(const Tensor& t);

struct RecoveryReport {
  bool fresh = true;                // no journal records: a first start
  uint64_t records = 0;             // replayed
  uint64_t dropped_tail_bytes = 0;  // torn tail cut off
  uint64_t pools = 0, tensors = 0;  // rebuilt
  uint64_t arenas_attached = 0;     // found in shared memory with their bytes
  uint64_t arenas_lost = 0;         // gone (reboot): recreated empty
  uint64_t arenas_refused = 0;      // not tierd's own or damaged: not used, removed, recreated empty
  uint64_t restored_from_snapshot = 0;
  uint64_t restored_from_nvme = 0;
  uint64_t lost_tensors = 0;  // RAM-only tensors not in a snapshot: gone
  uint64_t stale_arenas_removed = 0;
  uint64_t partial_snapshots_removed = 0;  // snapshot dirs not recorded durable, or dropped
  double ms = 0;                           // time open() took
};

// What durability works on, and nothing else: the catalog and the RAM tier it rebuilds and
// journals, the state directory, and the NVMe tier's files (to copy NVMe-only tensors into
// snapshots). All must outlive the Durability.
struct DurabilityDeps {
  Catalog& catalog;
  RamTier& ram;
  std::string state_dir;
  // Where a tensor evicted to NVMe comes back when its pool has no arena (the first node).
  int32_t default_node = 0;
  const nvme::Engine* nvme = nullptr;  // null without an NVMe tier
  // The state dir's space (daemon/durability/state_space.hpp): config text of snapshot_free_floor and
  // journal_reserve; empty floor: no floor and no reserve (tests of the journal alone).
  std::string snapshot_free_floor, journal_reserve;
};

class Durability final : public ResidencyLog {
 public:
  using Sink = std::function<void(uint64_t session_id, std::span<const std::byte> reply)>;

  // Opens (or creates) the journal in <state-dir>/journal and rebuilds the catalog and RAM
  // tier from it (the catalog must be empty). The caller then adopts the write leases held
  // across the restart and commits (open_durability in daemon/state/state.hpp does all of it). Errors:
  // kCorruption/kUnsupported (the journal is damaged before its tail or newer than this tierd: refuse to
  // start), kBusy (another tierd uses the state dir), kIo.
  [[nodiscard]] static Result<std::unique_ptr<Durability>> open(DurabilityDeps deps, RecoveryReport* report);
  ~Durability() override;  // waits for snapshot writers
  Durability(const Durability&) = delete;
  Durability& operator=(const Durability&) = delete;

  // --- records (call right after the in-memory change) ---
  void pool_created(const Pool& p);
  void pool_dropped(const Pool& p);      // also removes the pool's snapshot directory
  void tensor_created(const Tensor& t);  // with its arena's ArenaCreated the first time
  void tensor_deleted(const Tensor& t);
  void ram_placed(const Tensor& t) override;   // t.ram is its new RAM copy
  void ram_dropped(const Tensor& t) override;  // t has no RAM copy any more
  // The NVMe tier: only after the write of `loc` completed (never for bytes in flight).
  void nvme_copy_written(const Tensor& t, const nvme::NvmeLocation& loc) override;
  // The NVMe copy is freed or stale (a write lease was granted on the RAM copy).
  void nvme_copy_dropped(const Tensor& t) override;
  // Write leases (daemon/leases/reclaim.hpp): granted to `h` as `lease_id`, or ended (a no-op
  // when the journal has none on `t`). Appended at once (a kill -9 of tierd keeps them) but
  // never a reason to fsync: no lease outlives a power loss, its holder does not either.
  void write_lease_held(const Tensor& t, uint64_t lease_id, const LeaseHolder& h);
  void write_lease_ended(const Tensor& t);

  // The catalog as journaled, and whether recovery recreated an arena empty (a reboot).
  const journal::CatalogImage& image() const noexcept { return image_; }
  bool arena_recreated(uint64_t arena_id) const { return recreated_arenas_.contains(arena_id); }

  // --- group commit ---
  uint64_t last_seq() const noexcept { return journal_->last_seq(); }
  // Seq of the last record whose request must not be acknowledged before commit() (pool and
  // tensor creates, deletes, drops). The server holds a reply when handling moved it.
  uint64_t ack_seq() const noexcept { return ack_seq_; }
  // Records that need an fsync were appended since the last commit (write-lease records alone
  // do not).
  bool pending() const noexcept { return sync_seq_ > journal_->committed_seq(); }
  // Makes every appended record durable (one fdatasync) and compacts when due. An error is
  // fatal for the daemon: stop acknowledging.
  [[nodiscard]] Status commit() override;
  // OK, or the error that made the journal unusable (an append failed).
  const Status& health() const noexcept { return failed_; }

  // --- snapshots ---
  // Starts the point-in-time snapshot of `pool`; the reply to (session, request_id) comes
  // through poll()'s sink once durable. kBusy while a write lease is held on the pool or
  // another snapshot of it is running.
  // `tag` labels it (0: none; listed by the image); once it is durable the pool keeps its
  // newest `keep` (>= 1) durable snapshots and drops older ones. `reply_type` is the request's
  // type (Snapshot or SnapshotTake), for the reply.
  [[nodiscard]] Status start_snapshot(Pool& pool, uint64_t session_id, uint32_t request_id,
                                      uint16_t reply_type, uint64_t tag = 0, uint32_t keep = 1);
  // Rolls `pool` back to its durable snapshot `snapshot_id` (snapshot_restore.cpp): every
  // tensor the snapshot holds gets its bytes as of the snapshot (checksums verified for all of
  // them before anything changes), tensors the snapshot does not hold are deleted (tensors it
  // holds that were deleted since stay deleted, as after a reboot), snapshots newer than it
  // are dropped and PoolRestored ends a PoolRecovered state; committed before it returns.
  // Refused with kBusy while any lease of the pool is held or reserved for a reclaim, or a
  // snapshot of it runs; kNotFound for an unknown or not yet durable snapshot; kCorruption
  // when its files do not match their checksums (nothing changed then). Runs on the loop and
  // blocks it for the snapshot's read time (a rollback is a rare, whole-job event).
  struct RestoreHooks {
    // RAM for `t` that the caller then overwrites whole (the tier's placement; the NVMe copy
    // is stale from here).
    std::function<Result<std::byte*>(Pool&, Tensor&)> place;
    // Deletes `t`: its storage, its journal record and its catalog entry.
    std::function<void(Pool&, Tensor&)> erase;
  };
  struct RestoreCounts {
    uint64_t tensors = 0, bytes = 0, deleted = 0, dropped_snapshots = 0;
  };
  [[nodiscard]] Result<RestoreCounts> restore_snapshot(Pool& pool, uint64_t snapshot_id,
                                                       const RestoreHooks& hooks);
  bool snapshot_running(uint64_t pool_id) const;
  // What a snapshot of `pool` taken now writes to the state dir, about (data and manifest).
  [[nodiscard]] static uint64_t snapshot_estimate(const Pool& pool);
  // Bytes of `pool_id`'s snapshots in the state dir: the durable ones (what their directories
  // take on disk, measured when each became durable and again at start-up; at least what the
  // journal recorded) and one being written (its estimate). Charged to the pool's and its
  // owner's NVMe quotas until the snapshot is dropped.
  [[nodiscard]] uint64_t snapshot_bytes(uint64_t pool_id) const;
  const StateSpace& space() const noexcept { return space_; }
  // Before a write lease on `tensors` is decided: those a running snapshot has not copied yet
  // are handed to its writer now and pinned, so the lease waits (conflict) until they are in
  // the snapshot. Cheap when no snapshot runs.
  void copy_before_write(std::span<Tensor* const> tensors);
  // Whether a running snapshot pins one of `tensors` now (it is being copied). Such a lease
  // conflict is waited out even by a fail-fast lease: the pin goes once that tensor is copied.
  [[nodiscard]] bool pinned(std::span<Tensor* const> tensors) const;
  int event_fd() const noexcept { return efd_; }
  // Releases the pins of copied tensors, feeds the writers, finishes completed snapshots
  // (journal, commit, reply, remove older ones). Returns the journal's health; `released`
  // (when given) is set when pins went (lease waiters may now be granted).
  [[nodiscard]] Status poll(const Sink& sink, bool* released = nullptr);
  size_t snapshots_running() const noexcept { return jobs_.size(); }

  const RecoveryReport& recovery() const noexcept { return report_; }
  std::string snapshot_root() const { return deps_.state_dir + "/snapshots"; }

 private:
  // One snapshot in flight (loop thread only; the writer has its own state).
  struct Job {
    enum class State : uint8_t { kPending, kInFlight, kDone, kLeftOut };
    struct Entry {
      journal::TensorCreated meta;  // as of the snapshot's point
      uint64_t offset = 0;          // in the data file
      State state = State::kPending;
      uint64_t checksum = 0;
    };
    uint64_t pool_id = 0, snapshot_id = 0, session_id = 0;
    uint32_t request_id = 0;
    std::string dir;  // <state-dir>/snapshots/<pool>/<id>
    journal::PoolCreated pool;
    std::map<uint64_t, Entry> entries;  // by tensor id: the tensors of the point
    std::vector<uint64_t> order;        // the copy order (pool order)
    size_t next = 0;                    // first of `order` not handed out yet
    uint64_t in_flight = 0, in_flight_bytes = 0;
    bool finishing = false;
    uint64_t bytes = 0, stall_us = 0;
    uint64_t estimate = 0;  // snapshot_estimate() at the start: what it may still write
    uint32_t keep = 1;
    uint16_t reply_type = 0;
    std::unique_ptr<SnapshotWriter> writer;
  };
  // Most bytes handed to a writer and not yet copied (the pins held at once), beyond the
  // first tensor.
  static constexpr uint64_t kSnapshotWindow = uint64_t{32} << 20;
  static constexpr uint64_t kSnapshotWindowTensors = 64;  // and at most this many
 public:
  static constexpr uint32_t kMaxSnapshotsKept = 16;  // SnapshotTake's keep
 private:
  explicit Durability(DurabilityDeps deps) : deps_(std::move(deps)) {}
  void append(const journal::Record& r);
  // The id of the pool's next snapshot (numbered per pool).
  [[nodiscard]] uint64_t next_snapshot_id(uint64_t pool_id);
  [[nodiscard]] Status rebuild();
  // Reboot: fills the tensors of `need` from the pool's latest durable snapshot and leaves in
  // `need` those it could not; *from is that snapshot's id (left alone when none was usable).
  [[nodiscard]] Status restore_pool_from_snapshot(Pool& p, std::vector<Tensor*>& need, uint64_t* from);
  void remove_stale_arenas();
  // Bytes the snapshot directory `dir` takes on disk (its files' allocated blocks: the data,
  // holes excluded, and the manifest, which the journal's byte count leaves out).
  [[nodiscard]] static uint64_t measure_snapshot(const std::string& dir);
  // Start-up: removes partial and dropped snapshot directories, makes the rest 0700.
  void clean_snapshot_dirs();
  // Hands tensor `id` of `job` to its writer (pinned), or leaves it out when it is gone.
  void hand_out(Job& job, uint64_t id, bool urgent);
  void feed(Job& job);
  // Removes a snapshot directory off the event loop (unlinking a multi-GiB file takes the file
  // system hundreds of ms): renamed at once to <snapshots>/.removing-<n> (so the name is free
  // again), deleted by a background thread. Leftovers of a crash go at the next start-up.
  void remove_later(const std::string& path);
  void unpin(Job& job, uint64_t id);
  // Finishes `job` (its writer ended): journal, reply, cleanup.
  void complete(Job& job, const Sink& sink);

  DurabilityDeps deps_;
  std::unordered_map<uint64_t, uint64_t> next_snapshot_ids_;  // by pool id (next_snapshot_id())
  StateSpace space_;
  std::unique_ptr<journal::Journal> journal_;
  journal::CatalogImage image_;
  Status failed_;
  uint64_t ack_seq_ = 0;
  uint64_t sync_seq_ = 0;  // the last record that needs an fsync
  std::unordered_set<uint64_t> recreated_arenas_;
  // Durable snapshots' bytes on disk by (pool id, snapshot id): measure_snapshot() when one
  // becomes durable and at start-up; erased when the journal drops it (or its pool).
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> snapshot_disk_;
  RecoveryReport report_;
  int efd_ = -1;
  std::vector<std::unique_ptr<Job>> jobs_;
  struct Remover {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Remover> removers_;  // joined when done (remove_later) and in the destructor
  uint64_t removals_ = 0;
};

}  // namespace tier::daemon
