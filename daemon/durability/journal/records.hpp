// The catalog journal's record types: one struct per catalog change.
//
// Each struct declares its fields once in visit(), which drives both encoding and decoding
// through the wire codec (wire/codec.hpp), and names its on-disk RecordType in kType.
// Format rules (see format.hpp and docs/journal.md):
//   - RecordType values are on disk: never renumber or reuse one.
//   - Changing the fields of an existing type is a format change: add a new type instead
//     (or bump kFormatVersion). A reader refuses a type it does not know, naming it and the
//     file's format version, rather than skipping a change it does not understand.
//   - Payloads are decoded strictly: a payload that does not decode exactly is corruption.
// The journal itself gives no meaning to the fields; the daemon's catalog does (ids are the
// daemon's, unique across restarts thanks to the Watermarks record).
#pragma once

// clang-format off: the messages below are a table (fields, then their one-line visit), kept
// one line each so that a field and its place in the encoding are read together.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tier/status.hpp"
#include "wire/codec.hpp"

namespace tier::journal {

enum class RecordType : uint16_t {
  kPoolCreated = 1,
  kPoolDropped = 2,
  kTensorCreated = 3,
  kTensorDeleted = 4,
  kNvmeCopyWritten = 5,
  kNvmeCopyDropped = 6,
  kSnapshotBegun = 7,
  kSnapshotDurable = 8,
  kSnapshotDropped = 9,
  kWatermarks = 10,
  kTensorRamPlaced = 11,
  kTensorRamDropped = 12,
  kArenaCreated = 13,
  kManifestBegin = 14,
  kManifestEnd = 15,
  kWriteLeaseHeld = 16,
  kWriteLeaseEnded = 17,
  kSnapshotTagged = 18,
  kPoolRecovered = 19,
  kPoolRestored = 20,
};
inline constexpr uint16_t kMaxRecordType = 20;
[[nodiscard]] std::string_view record_type_name(RecordType t) noexcept;

// PoolCreated::flags (on-disk layout: bits never change meaning).
inline constexpr uint32_t kPoolGroupRead = 1u << 0;  // members of `group` may read the pool

struct PoolCreated {
  static constexpr RecordType kType = RecordType::kPoolCreated;
  uint64_t pool_id = 0;
  std::string name;
  uint32_t owner_uid = 0;
  uint32_t group = 0;  // the group that may read the pool when kPoolGroupRead is set
  uint32_t flags = 0;  // kPool* bits
  uint64_t ram_quota = 0;
  uint64_t nvme_quota = 0;
  template <class V> void visit(V& v) {
    v(pool_id); v(name); v(owner_uid); v(group); v(flags); v(ram_quota); v(nvme_quota);
  }
  bool operator==(const PoolCreated&) const = default;
};

// Drops the pool and, implicitly, every tensor, copy and snapshot record of it.
struct PoolDropped {
  static constexpr RecordType kType = RecordType::kPoolDropped;
  uint64_t pool_id = 0;
  template <class V> void visit(V& v) { v(pool_id); }
  bool operator==(const PoolDropped&) const = default;
};

// A new tensor and where its RAM copy lives (arena_id 0 / numa_node -1: no RAM copy).
struct TensorCreated {
  static constexpr RecordType kType = RecordType::kTensorCreated;
  uint64_t pool_id = 0;
  uint64_t tensor_id = 0;
  std::string name;
  uint64_t size = 0;
  uint8_t dtype = 0;  // tier::DType
  std::vector<int64_t> shape;
  int32_t numa_node = -1;  // logical NUMA node of the RAM copy
  uint64_t arena_id = 0;
  uint64_t offset = 0;      // byte offset of the RAM copy in the arena
  uint64_t ram_length = 0;  // bytes allocated there (>= size: the allocator's rounding)
  template <class V> void visit(V& v) {
    v(pool_id); v(tensor_id); v(name); v(size); v(dtype); v(shape); v(numa_node); v(arena_id);
    v(offset); v(ram_length);
  }
  bool operator==(const TensorCreated&) const = default;
};

struct TensorDeleted {
  static constexpr RecordType kType = RecordType::kTensorDeleted;
  uint64_t pool_id = 0;
  uint64_t tensor_id = 0;
  template <class V> void visit(V& v) { v(pool_id); v(tensor_id); }
  bool operator==(const TensorDeleted&) const = default;
};

// One extent of an NVMe copy: `length` bytes at `offset` in `dir`/`file`.
struct Extent {
  std::string dir;
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;  // of the extent's bytes, as the NVMe tier computes it
  template <class V> void visit(V& v) { v(dir); v(file); v(offset); v(length); v(checksum); }
  bool operator==(const Extent&) const = default;
};

// The tensor's NVMe copy of `generation` is complete and valid. Contract: appended only after
// the NVMe write (and its fsync, if the daemon wants the copy to survive a reboot) completed,
// so a replayed copy is never one whose bytes were still in flight.
struct NvmeCopyWritten {
  static constexpr RecordType kType = RecordType::kNvmeCopyWritten;
  uint64_t tensor_id = 0;
  uint64_t generation = 0;
  std::vector<Extent> extents;
  template <class V> void visit(V& v) { v(tensor_id); v(generation); v(extents); }
  bool operator==(const NvmeCopyWritten&) const = default;
};

// The NVMe copy is gone or stale (freed, or the RAM copy was leased for writing).
struct NvmeCopyDropped {
  static constexpr RecordType kType = RecordType::kNvmeCopyDropped;
  uint64_t tensor_id = 0;
  uint64_t generation = 0;
  template <class V> void visit(V& v) { v(tensor_id); v(generation); }
  bool operator==(const NvmeCopyDropped&) const = default;
};

// The tensor's RAM copy now lives here (brought back from NVMe, or moved).
struct TensorRamPlaced {
  static constexpr RecordType kType = RecordType::kTensorRamPlaced;
  uint64_t tensor_id = 0;
  int32_t numa_node = -1;
  uint64_t arena_id = 0;
  uint64_t offset = 0;
  uint64_t ram_length = 0;
  template <class V> void visit(V& v) {
    v(tensor_id); v(numa_node); v(arena_id); v(offset); v(ram_length);
  }
  bool operator==(const TensorRamPlaced&) const = default;
};

// The tensor's RAM copy was freed (evicted); its bytes live only on NVMe now.
struct TensorRamDropped {
  static constexpr RecordType kType = RecordType::kTensorRamDropped;
  uint64_t tensor_id = 0;
  template <class V> void visit(V& v) { v(tensor_id); }
  bool operator==(const TensorRamDropped&) const = default;
};

// A pool's arena on a node (dropped with the pool).
struct ArenaCreated {
  static constexpr RecordType kType = RecordType::kArenaCreated;
  uint64_t pool_id = 0;
  uint64_t arena_id = 0;
  int32_t numa_node = -1;
  std::string shm_name;  // the named shared-memory object
  uint64_t size = 0;
  template <class V> void visit(V& v) { v(pool_id); v(arena_id); v(numa_node); v(shm_name); v(size); }
  bool operator==(const ArenaCreated&) const = default;
};

struct SnapshotBegun {
  static constexpr RecordType kType = RecordType::kSnapshotBegun;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  std::string path;  // the snapshot's directory or manifest
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); v(path); }
  bool operator==(const SnapshotBegun&) const = default;
};

// Appended only once every byte and the manifest of the snapshot are fsynced.
struct SnapshotDurable {
  static constexpr RecordType kType = RecordType::kSnapshotDurable;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  std::string path;
  uint64_t bytes = 0;
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); v(path); v(bytes); }
  bool operator==(const SnapshotDurable&) const = default;
};

struct SnapshotDropped {
  static constexpr RecordType kType = RecordType::kSnapshotDropped;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); }
  bool operator==(const SnapshotDropped&) const = default;
};

// The client's label of a snapshot (e.g. a training step), appended right after its
// SnapshotBegun when the request carried one. Tags need not be unique.
struct SnapshotTagged {
  static constexpr RecordType kType = RecordType::kSnapshotTagged;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  uint64_t tag = 0;
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); v(tag); }
  bool operator==(const SnapshotTagged&) const = default;
};

// A restart found an arena of the pool gone (a reboot) or refused, and rebuilt the pool from
// snapshot `snapshot_id` (0: none) and the tensors' NVMe copies; `lost` tensors had neither.
// The pool's bytes are then a mix of two points in time (each NVMe copy is newer than the
// snapshot), which clients that need one consistent point (a training job) must know:
// kept until the pool is restored from a snapshot (PoolRestored) or dropped.
struct PoolRecovered {
  static constexpr RecordType kType = RecordType::kPoolRecovered;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  uint64_t lost = 0;
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); v(lost); }
  bool operator==(const PoolRecovered&) const = default;
};

// The pool was rolled back to snapshot `snapshot_id`: every tensor of the snapshot holds its
// bytes as of the snapshot (their NVMe copies dropped and RAM placements journaled before
// this), tensors the snapshot does not hold were deleted, and newer snapshots dropped. Ends
// a PoolRecovered state.
struct PoolRestored {
  static constexpr RecordType kType = RecordType::kPoolRestored;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); }
  bool operator==(const PoolRestored&) const = default;
};

// Every id the daemon hands out is below these; a restarted daemon starts from them. The daemon
// may reserve ids in blocks (journal next = current + block) to avoid one record per create.
struct Watermarks {
  static constexpr RecordType kType = RecordType::kWatermarks;
  uint64_t next_pool_id = 1;
  uint64_t next_tensor_id = 1;
  uint64_t next_snapshot_id = 1;
  uint64_t next_arena_id = 1;
  uint64_t next_generation = 1;
  template <class V> void visit(V& v) {
    v(next_pool_id); v(next_tensor_id); v(next_snapshot_id); v(next_arena_id); v(next_generation);
  }
  bool operator==(const Watermarks&) const = default;
};

// Snapshot manifests (manifest.hpp) open with ManifestBegin and close with ManifestEnd; in
// between, the pool's PoolCreated and, per tensor, TensorCreated + NvmeCopyWritten.
struct ManifestBegin {
  static constexpr RecordType kType = RecordType::kManifestBegin;
  uint64_t pool_id = 0;
  uint64_t snapshot_id = 0;
  uint64_t created_unix_ms = 0;
  template <class V> void visit(V& v) { v(pool_id); v(snapshot_id); v(created_unix_ms); }
  bool operator==(const ManifestBegin&) const = default;
};
struct ManifestEnd {
  static constexpr RecordType kType = RecordType::kManifestEnd;
  uint64_t records = 0;  // records between ManifestBegin and this one
  uint64_t bytes = 0;    // tensor bytes covered
  template <class V> void visit(V& v) { v(records); v(bytes); }
  bool operator==(const ManifestEnd&) const = default;
};

// A client holds a write lease on the tensor's RAM copy and may be storing into it through
// its mapping (docs/daemon.md, "Leases across a restart"). A restarted daemon keeps that
// extent reserved for the holder until it reclaims the lease (naming `lease_id`), is known to
// be gone, or the reclaim timeout passes. A later record for the same tensor replaces it (a
// reclaim grants a new lease id). The holder as tierd saw it: uid and pid from SO_PEERCRED,
// the process's start time (field 22 of /proc/<pid>/stat, clock ticks after boot; 0 unknown)
// and the inode of tierd's own pid namespace, in which `pid` means that process.
// Appended at grant, before the reply; not fsynced on its own (a lease cannot outlive a power
// loss: its holder dies too).
struct WriteLeaseHeld {
  static constexpr RecordType kType = RecordType::kWriteLeaseHeld;
  uint64_t tensor_id = 0;
  uint64_t lease_id = 0;
  uint32_t uid = 0;
  int32_t pid = 0;
  uint64_t pid_start = 0;
  uint64_t pid_ns = 0;
  template <class V> void visit(V& v) { v(tensor_id); v(lease_id); v(uid); v(pid); v(pid_start); v(pid_ns); }
  bool operator==(const WriteLeaseHeld&) const = default;
};

// The tensor's write lease ended (released, its client's connection closed, or a restarted
// daemon gave up waiting for the holder). No-op when the tensor has none.
struct WriteLeaseEnded {
  static constexpr RecordType kType = RecordType::kWriteLeaseEnded;
  uint64_t tensor_id = 0;
  template <class V> void visit(V& v) { v(tensor_id); }
  bool operator==(const WriteLeaseEnded&) const = default;
};

using Record = std::variant<PoolCreated, PoolDropped, TensorCreated, TensorDeleted,
                            NvmeCopyWritten, NvmeCopyDropped, SnapshotBegun, SnapshotDurable,
                            SnapshotDropped, Watermarks, TensorRamPlaced, TensorRamDropped,
                            ArenaCreated, ManifestBegin, ManifestEnd, WriteLeaseHeld,
                            WriteLeaseEnded, SnapshotTagged, PoolRecovered, PoolRestored>;
static_assert(std::variant_size_v<Record> == kMaxRecordType, "one alternative per RecordType");

[[nodiscard]] RecordType record_type(const Record& r) noexcept;

// Appends the payload encoding of `r` (not the header) to `out`.
void encode_payload(const Record& r, std::vector<std::byte>& out);

// Decodes a payload of `type`. kUnsupported for a type this build does not know, kCorruption
// for a payload that does not decode exactly (messages name the type, not the offset; the
// reader adds that).
[[nodiscard]] Result<Record> decode_payload(uint16_t type, std::span<const std::byte> payload);

}  // namespace tier::journal
// clang-format on
