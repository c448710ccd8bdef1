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
// (journaled) and its tensors are restored from the pool's latest durable snapshot; tensors neither in the snapshot nor with a
// journaled NVMe copy are lost: deleted from the catalog (journaled), counted and logged.
// Arena objects of this state dir that the journal does not name are removed.
//
// Snapshots: start_snapshot() copies the pool's RAM-resident tensors into a private staging
// buffer on the event loop (the stall: no lease can be granted meanwhile; it refuses while a
// write lease is held) and a background thread writes them to
// <state-dir>/snapshots/<pool>/<id>/{data,manifest}, fsyncing files and directories. poll() (the
// event_fd() became readable) journals SnapshotDurable, commits, then answers the request and
// removes the pool's older snapshots.
//
// Thread-safety: everything runs on the event-loop thread except each snapshot's writer thread,
// which touches only its own job (staging buffer, files) and publishes completion through an
// atomic flag and the eventfd.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "daemon/journal/catalog_image.hpp"
#include "daemon/journal/journal.hpp"
#include "tier/status.hpp"

namespace tier::nvme {
struct NvmeLocation;
}

namespace tier::daemon {

struct DaemonState;
struct LeaseHolder;
struct Pool;
struct Tensor;

// The journal record of a pool as it is now (name, owner, quotas, group read access).
[[nodiscard]] journal::PoolCreated pool_record(const Pool& p);

struct RecoveryReport {
  bool fresh = true;                 // no journal records: a first start
  uint64_t records = 0;              // replayed
  uint64_t dropped_tail_bytes = 0;   // torn tail cut off
  uint64_t pools = 0, tensors = 0;   // rebuilt
  uint64_t arenas_attached = 0;      // found in shared memory with their bytes
  uint64_t arenas_lost = 0;          // gone (reboot): recreated empty
  uint64_t arenas_refused = 0;       // not tierd's own or damaged: not used, removed, recreated empty
  uint64_t restored_from_snapshot = 0;
  uint64_t restored_from_nvme = 0;
  uint64_t lost_tensors = 0;         // RAM-only tensors not in a snapshot: gone
  uint64_t stale_arenas_removed = 0;
  double ms = 0;                     // time open() took
};

class Durability {
 public:
  using Sink = std::function<void(uint64_t session_id, std::span<const std::byte> reply)>;

  // Opens (or creates) the journal in <state-dir>/journal and rebuilds `st`'s catalog and RAM
  // tier from it (st.catalog must be empty). Errors: kCorruption/kUnsupported (the journal is
  // damaged before its tail or newer than this tierd: refuse to start), kBusy (another tierd
  // uses the state dir), kIo.
  [[nodiscard]] static Result<std::unique_ptr<Durability>> open(DaemonState& st, RecoveryReport* report);
  ~Durability();  // waits for snapshot writers
  Durability(const Durability&) = delete;
  Durability& operator=(const Durability&) = delete;

  // --- records (call right after the in-memory change) ---
  void pool_created(const Pool& p);
  void pool_dropped(const Pool& p);  // also removes the pool's snapshot directory
  void tensor_created(const Tensor& t);  // with its arena's ArenaCreated the first time
  void tensor_deleted(const Tensor& t);
  void ram_placed(const Tensor& t);      // t.ram is its new RAM copy
  void ram_dropped(const Tensor& t);     // t has no RAM copy any more
  // The NVMe tier: only after the write of `loc` completed (never for bytes in flight).
  void nvme_copy_written(const Tensor& t, const nvme::NvmeLocation& loc);
  // The NVMe copy is freed or stale (a write lease was granted on the RAM copy).
  void nvme_copy_dropped(const Tensor& t);
  // Write leases (daemon/lease_reclaim.hpp): granted to `h` as `lease_id`, or ended (a no-op
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
  [[nodiscard]] Status commit();
  // OK, or the error that made the journal unusable (an append failed).
  const Status& health() const noexcept { return failed_; }

  // --- snapshots ---
  // Takes the point-in-time copy of `pool` and starts persisting it; the reply to
  // (session, request_id) comes through poll()'s sink once durable. kBusy while a write lease
  // is held on the pool or another snapshot of it is running.
  [[nodiscard]] Status start_snapshot(Pool& pool, uint64_t session_id, uint32_t request_id);
  int event_fd() const noexcept { return efd_; }
  // Finishes completed snapshots: journal, commit, reply, remove older ones.
  [[nodiscard]] Status poll(const Sink& sink);
  size_t snapshots_running() const noexcept { return jobs_.size(); }

  const RecoveryReport& recovery() const noexcept { return report_; }
  std::string snapshot_root() const { return state_dir_ + "/snapshots"; }

 private:
  // One snapshot in flight. The writer thread owns `staging` and the files; the loop thread
  // reads `result` only after `done` is set (release/acquire).
  struct Job {
    uint64_t pool_id = 0, snapshot_id = 0, session_id = 0;
    uint32_t request_id = 0;
    std::string dir;  // <state-dir>/snapshots/<pool>/<id>
    journal::PoolCreated pool;
    std::vector<journal::TensorCreated> tensors;  // offsets: in `staging` and in the data file
    std::vector<uint64_t> offsets;
    // Anonymous mapping, populated when made (one kernel call instead of a page fault per
    // 4 KiB during the copy, which is the stall).
    struct Staging {
      std::byte* p = nullptr;
      uint64_t n = 0;
      ~Staging() { reset(); }
      void reset() noexcept;
      std::byte* get() const noexcept { return p; }
      explicit operator bool() const noexcept { return p != nullptr; }
    } staging;
    uint64_t bytes = 0, stall_us = 0;
    int efd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
    Status result;
  };
  explicit Durability(DaemonState& st) : st_(st) {}
  void append(const journal::Record& r);
  [[nodiscard]] Status rebuild();
  [[nodiscard]] Status restore_pool_from_snapshot(Pool& p, std::vector<Tensor*>& need);
  void remove_stale_arenas();
  static void write_job(Job& job);

  DaemonState& st_;
  std::string state_dir_;
  std::unique_ptr<journal::Journal> journal_;
  journal::CatalogImage image_;
  Status failed_;
  uint64_t ack_seq_ = 0;
  uint64_t sync_seq_ = 0;  // the last record that needs an fsync
  std::unordered_set<uint64_t> recreated_arenas_;
  RecoveryReport report_;
  int efd_ = -1;
  std::vector<std::unique_ptr<Job>> jobs_;
};

}  // namespace tier::daemon
