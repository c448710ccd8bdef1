// Where a rank keeps its ZeRO-3 shards: private memory (--state resident, the baseline) or
// tensors in a tierd pool (--state tier). The trainer sees only pinned views of shard tensors.
//
// Per rank and layer the store holds: param, m, v (AdamW moments) in `buffers` copies (1, or 2
// for double buffering: the optimizer of step s reads copy (s-1)%2 and writes copy s%2, so a
// step interrupted half-way leaves the last committed copy intact), and one grad. With
// --precision bf16, param and grad hold bf16 values and an fp32 master copy of the params
// (`buffers` copies) is added; m and v stay fp32. Plus a
// commit marker per daemon (shared by the ranks whose state it holds, see marker_domain) that
// says which step completed last on every rank. With --offload-checkpoints (tier only) it
// also holds one activation checkpoint per block: scratch of the step in progress, never part
// of a commit (a resume, a reshard and the snapshots' rollback do not read them).
//
// Thread-safety: acquire/prefetch may be called from the comm thread and the main thread at
// once; implementations are thread-safe. A Pinned view must be released (or destroyed) before
// the store is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tier/status.hpp"
#include "wire/errors.hpp"

namespace tier {
class Client;
}

namespace tier::train {

// kCkpt is not a shard: block l's input x_{l-1} [B,T,C] of this rank (layers 1..L, buffer 0),
// written whole in forward and read in backward (--offload-checkpoints). kMaster: the fp32
// master parameters of --precision bf16 (fp32 has none: its params are their own master copy).
enum class ShardKind : uint8_t { kParam = 0, kM = 1, kV = 2, kGrad = 3, kCkpt = 4, kMaster = 5 };
inline constexpr size_t kShardKinds = 6;
const char* shard_kind_name(ShardKind k);

// --precision. fp32: every shard fp32. bf16: param and grad shards bf16 (trainer/bf16.hpp),
// master, m and v fp32 (docs/trainer.md, "Mixed precision").
enum class Precision : uint8_t { kFp32 = 0, kBf16 = 1 };
const char* precision_name(Precision p);
// Bytes of one element of a shard of kind k: 2 for bf16 param and grad, else 4.
size_t shard_elem_bytes(ShardKind k, Precision p);

struct ShardRef {
  int layer = 0;
  ShardKind kind = ShardKind::kParam;
  int buffer = 0;  // 0 or 1 for param/m/v when double buffered; 0 for grad
};

// How a pin uses the shard. kOverwrite: every float is written and none read first (a tierd
// overwrite lease: a shard spilled to NVMe is not read back for it).
enum class Access : uint8_t { kRead, kWrite, kOverwrite };

// Which stream of work a call belongs to: the passes (gathers, reduce-scatters) or the
// optimizer's thread (--overlap-optimizer). The tier store gives each its own tierd client,
// so each has its own plan and plan cursor in the daemon.
enum class Lane : uint8_t { kPass = 0, kOptimizer = 1 };

// One use of a shard in a step's plan.
struct ShardUse {
  ShardRef ref;
  bool overwrite = false;  // the use pins it with Access::kOverwrite
};

// A shard's bytes, pinned while `pin` is alive (a tierd lease, or nothing for resident).
// `data` is typed for fp32 shards; a bf16 shard's values are at bf16().
struct Pinned {
  float* data = nullptr;
  size_t floats = 0;  // elements: floats, or bf16 values for a bf16 shard
  std::shared_ptr<void> pin;
  void release() { pin.reset(); }
  uint16_t* bf16() const { return reinterpret_cast<uint16_t*>(data); }
};

struct StoreLayout {
  int rank = 0, ranks = 1, local_rank = 0;
  std::string gpu_pci;               // the rank's GPU (PCI address), "" without one
  int buffers = 1;                   // 1 or 2
  std::vector<size_t> shard_floats;  // per layer: padded layer size / ranks (elements)
  Precision precision = Precision::kFp32;
  size_t ckpt_floats = 0;  // per block's checkpoint ([B,T,C]); 0: none in the store
};

// What the marker records: steps completed by every rank and the run's identity, so a resume
// can refuse state written by a different model or rank count.
struct CommitMarker {
  static constexpr uint64_t kMagic = 0x7469657274726e31ull;  // "tiertrn1"; layout version 1
  uint64_t magic = 0;
  uint64_t step = 0;  // steps completed; their params are in buffer step % buffers
  uint64_t ranks = 0;
  uint64_t config_hash = 0;
};
static_assert(sizeof(CommitMarker) == 32, "the commit marker is stored as-is in a tensor");

class ShardStore {
 public:
  virtual ~ShardStore() = default;
  virtual const char* name() const = 0;
  // Creates (or, when they exist, opens) every tensor of this rank and the marker.
  [[nodiscard]] virtual Status open(const StoreLayout& layout) = 0;
  [[nodiscard]] virtual Result<Pinned> acquire(const ShardRef& ref, Access access,
                                               Lane lane = Lane::kPass) = 0;
  // Pins many at once (one round trip for tierd). Same order as refs.
  [[nodiscard]] virtual Result<std::vector<Pinned>> acquire_many(std::span<const ShardRef> refs,
                                                                 Access access, Lane lane = Lane::kPass);
  // Releases every pin in `pins` (one daemon round trip for tierd); they become empty. A pin
  // shared by several entries is released once.
  virtual void release_many(std::vector<Pinned>& pins, Lane lane = Lane::kPass) {
    (void)lane;
    for (auto& p : pins) p.release();
  }
  // Hints that these shards are needed soon. Best effort; errors are ignored.
  virtual void prefetch(std::span<const ShardRef> refs, Lane lane = Lane::kPass) {
    (void)refs;
    (void)lane;
  }
  // The shards' bytes are dead until they are next written whole (a gradient after the update
  // read it): tierd may then drop a RAM copy without writing it back. Best effort.
  virtual void discard(std::span<const ShardRef> refs, Lane lane = Lane::kPass) {
    (void)refs;
    (void)lane;
  }
  // Registers the ordered shard uses of one step. Best effort.
  virtual void set_plan(std::span<const ShardUse> uses, Lane lane = Lane::kPass) {
    (void)uses;
    (void)lane;
  }
  // The marker of the daemon (or memory) that holds this rank's state. Ranks whose
  // marker_domain() is equal share one marker; each domain has one. Usable before open()
  // (a resume checks it before opening replaces another rank count's shards): a store that
  // holds no marker yet returns an invalid one (magic 0).
  [[nodiscard]] virtual Result<CommitMarker> read_marker() = 0;
  // Publishes the marker (one rank per marker_domain(), after every rank finished the step).
  [[nodiscard]] virtual Status write_marker(const CommitMarker& m) = 0;
  // Names what holds this rank's marker, valid after open(): equal for exactly the ranks that
  // read and write the same marker (for tierd, the same daemon, whatever the host layout:
  // two daemons on one host differ, one daemon reached through two paths does not).
  virtual std::string marker_domain() const = 0;
  // Bytes the node has read from and written to NVMe so far (tierd's counters; node-wide), or
  // -1 each when the store has no NVMe tier.
  struct NvmeIo {
    int64_t read = -1, written = -1;
  };
  virtual NvmeIo nvme_io() { return {}; }
  // What an earlier run left in the store, by tensor name, usable before open() (--resume
  // --reshard reads another rank count's shards): copies tensor `name` into `out` and returns
  // true, or false when the store has no tensor of that name and size. Unsupported where the
  // state does not outlive its process.
  [[nodiscard]] virtual Result<bool> read_named(const std::string& name, std::span<std::byte> out) {
    (void)name;
    (void)out;
    return fail(Code::kUnsupported, "this store keeps no state across runs");
  }
  // Deletes tensor `name` if it exists (another rank count's shards once resharded).
  [[nodiscard]] virtual Status drop_named(const std::string& name) {
    (void)name;
    return Status(Code::kUnsupported, "this store keeps no state across runs");
  }
  // The names of every tensor the job's pool in this store holds (all ranks'), after open().
  [[nodiscard]] virtual Result<std::vector<std::string>> names() {
    return fail(Code::kUnsupported, "this store keeps no state across runs");
  }
  // Snapshots of the daemon's pool (--snapshot-every; trainer/rollback.cpp). One rank per
  // marker_domain() calls them, while no rank of that domain holds a pin. snapshot(): a
  // durable copy of the whole pool tagged `tag` (the committed step), keeping the newest
  // `keep`. snapshots(): those the daemon holds, and whether a restart rebuilt the pool after
  // its RAM was lost (a reboot: then its bytes are not one step's). restore(): the pool as it
  // was at snapshot `id`. kUnsupported where the state does not outlive its process.
  struct SnapshotState {
    bool recovered = false;
    std::vector<std::pair<uint64_t, uint64_t>> snapshots;  // (id, tag), oldest first
  };
  [[nodiscard]] virtual Status snapshot(uint64_t tag, uint32_t keep) {
    (void)tag;
    (void)keep;
    return Status(Code::kUnsupported, "this store keeps no state across runs");
  }
  [[nodiscard]] virtual Result<SnapshotState> snapshots() {
    return fail(Code::kUnsupported, "this store keeps no state across runs");
  }
  [[nodiscard]] virtual Status restore(uint64_t id) {
    (void)id;
    return Status(Code::kUnsupported, "this store keeps no state across runs");
  }
  // Bytes this rank keeps in the store.
  virtual uint64_t bytes() const = 0;
  // For a GPU stager (trainer/cuda/pipeline_pass.hpp), which must pin the memory that
  // acquire() hands out. client(): the tierd client whose leases Lane::kPass returns (its
  // arenas), or null. private_ranges(): the store's own memory holding every shard (resident),
  // valid from open() until the store is destroyed; empty for tierd. Neither transfers
  // ownership; a stager bound to either must be destroyed before the store.
  virtual Client* client() { return nullptr; }
  virtual std::vector<std::span<std::byte>> private_ranges() { return {}; }
};

std::unique_ptr<ShardStore> make_resident_store();

struct TierStoreOptions {
  std::string socket;  // empty: $TIERD_SOCKET or the default
  std::string pool = "tier-train";
  uint64_t ram_quota = 0;   // 0: the daemon's default
  uint64_t nvme_quota = 0;  // 0: the daemon's default
  // A second connection for Lane::kOptimizer (--overlap-optimizer); without it that lane uses
  // the passes' connection.
  bool optimizer_lane = false;
};
// Connects to tierd (kUnavailable when it cannot be reached).
[[nodiscard]] Result<std::unique_ptr<ShardStore>> make_tier_store(const TierStoreOptions& o);

// "r3.l12.param.1": rank, layer, kind, buffer (the grad and the checkpoint "r3.l12.ckpt" have no
// buffer suffix). A shard's name does not say its precision: the config hash of the commit
// marker does (run_config_hash).
std::string shard_tensor_name(int rank, const ShardRef& ref);

}  // namespace tier::train
