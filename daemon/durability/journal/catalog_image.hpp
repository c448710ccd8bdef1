// CatalogImage: the catalog exactly as the journal describes it, rebuilt by applying records.
//
// It gives the records their meaning in one place, so that
//   - replay can check that a journal makes sense (a tensor of a pool that does not exist, an id
//     created twice: kCorruption naming the record, rather than a catalog built on it);
//   - compaction can write the live state: emit_live() produces one record per live object, in
//     an order that apply() accepts, and applying them to an empty image gives an equal image;
//   - the daemon can build its own catalog from the image after Journal::open, or maintain an
//     image beside its catalog and compact from it.
// Rules applied (docs/journal.md):
//   PoolCreated        new pool (id and name unique among live pools)
//   PoolDropped        the pool, its arenas, tensors and snapshots go
//   ArenaCreated       new arena of a live pool (id unique), or again for an arena of the same
//                      pool: its object was re-created under a new name (replaces the record)
//   TensorCreated      new tensor of a live pool (id unique among live tensors); its RAM
//                      copy is (arena_id, offset, ram_length), none when arena_id is 0
//   TensorDeleted      the tensor goes
//   TensorRamPlaced    the tensor's RAM copy is now there; TensorRamDropped: it has none
//   NvmeCopyWritten    the tensor's NVMe copy is this one (replacing an older generation)
//   NvmeCopyDropped    the NVMe copy of that generation goes (another generation: no-op)
//   SnapshotBegun/Durable/Dropped   a pool's snapshot is started / durable / gone
//   SnapshotTagged     a snapshot of the pool gets the client's tag
//   PoolRecovered      the pool was rebuilt after losing its RAM (replaces an earlier one)
//   PoolRestored       the pool was rolled back to one of its durable snapshots: clears
//                      PoolRecovered (the snapshot must exist and be durable)
//   WriteLeaseHeld     the tensor is write-leased by that holder (replacing an earlier one);
//                      WriteLeaseEnded: it is not (no-op when it was not)
//   Watermarks         next ids: the image keeps the maximum seen of each, and never less than
//                      one past any id it has seen
//   ManifestBegin/End  refused: they belong in manifests, not journals
// Not thread-safe; a plain value.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include "journal/journal.hpp"
#include "journal/records.hpp"
#include "tier/status.hpp"

namespace tier::journal {

struct TensorImage {
  TensorCreated meta;  // with the current RAM placement (arena_id 0: no RAM copy)
  std::optional<NvmeCopyWritten> nvme;
  std::optional<WriteLeaseHeld> write_lease;  // held by a client now
  bool operator==(const TensorImage&) const = default;
};

struct SnapshotImage {
  uint64_t snapshot_id = 0;
  std::string path;
  bool durable = false;
  uint64_t bytes = 0;
  uint64_t tag = 0;  // the client's label (SnapshotTagged); 0: none
  bool operator==(const SnapshotImage&) const = default;
};

struct PoolImage {
  PoolCreated meta;
  std::map<uint64_t, ArenaCreated> arenas;      // by arena id
  std::map<uint64_t, TensorImage> tensors;      // by tensor id
  std::map<uint64_t, SnapshotImage> snapshots;  // by snapshot id
  // Set when a restart rebuilt the pool after losing its RAM (a mix of the snapshot and newer
  // NVMe copies), until a PoolRestored.
  std::optional<PoolRecovered> recovered;
  bool operator==(const PoolImage&) const = default;
};

class CatalogImage {
 public:
  // Applies one record. kCorruption naming the record when it contradicts the image; the
  // image is unchanged then.
  [[nodiscard]] Status apply(const Record& r);

  // A RecordVisitor for Journal::open that applies every replayed record.
  [[nodiscard]] RecordVisitor replayer();

  // Emits the live state: Watermarks, then per pool PoolCreated, its ArenaCreated, per tensor
  // TensorCreated (+ NvmeCopyWritten, + WriteLeaseHeld), per snapshot SnapshotBegun (+ SnapshotTagged, +
  // SnapshotDurable), then PoolRecovered when set.
  [[nodiscard]] Status emit_live(const Journal::Emit& emit) const;

  const std::map<uint64_t, PoolImage>& pools() const noexcept { return pools_; }
  const Watermarks& watermarks() const noexcept { return marks_; }
  const TensorImage* tensor(uint64_t tensor_id) const noexcept;
  size_t tensor_count() const noexcept { return tensor_pool_.size(); }

  bool operator==(const CatalogImage& o) const { return pools_ == o.pools_ && marks_ == o.marks_; }

 private:
  PoolImage* pool(uint64_t id);
  TensorImage* tensor_mut(uint64_t id);
  void see_ids(uint64_t pool_id, uint64_t tensor_id, uint64_t snapshot_id, uint64_t arena_id,
               uint64_t generation);

  std::map<uint64_t, PoolImage> pools_;
  std::unordered_map<uint64_t, uint64_t> tensor_pool_;  // tensor id -> pool id
  std::unordered_map<uint64_t, uint64_t> arena_pool_;   // arena id -> pool id
  Watermarks marks_;
};

}  // namespace tier::journal
