// libtier: the client side of tierd. What a training binary includes.
//
//   auto c = tier::Client::connect();                      // $TIERD_SOCKET or /run/tierd/tierd.sock
//   auto pool = c->create_pool("job1", {.ram_quota = 64ull << 30}, /*exist_ok=*/true);
//   auto t = c->create_tensor("job1", {.name = "w0", .size = 1 << 20});
//   auto lease = c->lease(t->id, tier::LeaseMode::kWrite);  // bytes stay put while held
//   std::ranges::fill(lease->bytes(), std::byte{0});       // zero-copy into the daemon's arena
//
// Thread-safety: a Client may be used from many threads at once; requests on one Client are
// serialized on its socket. Lifetime: a Lease refers to its Client and must not outlive it;
// every lease of a Client is released by the daemon when the Client is destroyed or its
// process dies. Arena mappings stay valid for the Client's lifetime.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/status.hpp"
#include "tier/types.hpp"

namespace tier {

class Client;

// The socket a client connects to when none is given: $TIERD_SOCKET, else this.
inline constexpr const char* kDefaultSocketPath = "/run/tierd/tierd.sock";
[[nodiscard]] TIER_EXPORT std::string default_socket_path();

struct ConnectOptions {
  std::string client_name;  // shown by tierctl status; defaults to the program name
  // Retry connecting while the daemon is not yet (or no longer) accepting, up to this long.
  std::chrono::milliseconds connect_timeout{0};
  // When tierd restarts under a live Client (a call finds the connection closed), the Client
  // reconnects for up to this long (backoff 10 ms doubling to 500 ms), re-acquires the leases it
  // holds and retries the call; 0: no reconnecting, calls fail with kUnavailable at once. See
  // docs/client.md, "Daemon restarts".
  std::chrono::milliseconds reconnect_timeout{10000};
};

// How long lease() waits for a conflicting lease to go away.
struct LeaseWait {
  static constexpr int32_t kForever = -1;
  int32_t timeout_ms = 0;  // 0: fail fast with kBusy; > 0: wait up to this; kForever: wait
};

// A pin on one tensor: while alive, bytes() stays valid at a fixed address in the mapped
// arena. Read leases are shared, write leases exclusive. Move-only; released on destruction.
class [[nodiscard]] TIER_EXPORT Lease {
 public:
  Lease() = default;
  Lease(Lease&& o) noexcept;
  Lease& operator=(Lease&& o) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  bool valid() const noexcept { return client_ != nullptr; }
  uint64_t id() const noexcept { return id_; }
  uint64_t tensor_id() const noexcept { return tensor_id_; }
  LeaseMode mode() const noexcept { return mode_; }
  // The tensor's bytes in the arena. Writable only under a write lease (a read lease maps the
  // same memory; writing through it is a contract violation the daemon cannot see).
  std::span<std::byte> bytes() const noexcept { return bytes_; }
  // Releases now; returns the daemon's answer. A released or moved-from lease is a no-op.
  Status release();

 private:
  friend class Client;
  // Forgets the lease without telling the daemon (batched release gives it back another way).
  void detach() noexcept { client_ = nullptr; }
  Client* client_ = nullptr;
  uint64_t id_ = 0;
  uint64_t tensor_id_ = 0;
  LeaseMode mode_ = LeaseMode::kRead;
  std::span<std::byte> bytes_;
  uint32_t epoch_ = 0;  // the Client's connection epoch when granted (reconnects bump it)
};

// Node-wide figures, as `tierctl status` shows them.
struct RamTierStatus {
  int32_t node;
  uint64_t capacity, used, dirty, tensors;
};
struct NvmeTierStatus {
  std::string path;
  int32_t numa_node;
  std::string backend;
  uint64_t capacity, used;
};
struct NodeStatus {
  std::string daemon_version;
  uint64_t uptime_ms = 0;
  uint32_t clients = 0, pools = 0;
  uint64_t leases = 0;
  std::vector<RamTierStatus> ram;
  std::vector<NvmeTierStatus> nvme;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t hits = 0, misses = 0, stalls = 0, evictions = 0, prefetches = 0;
  uint64_t requests = 0, errors = 0;
};

struct TopoNode {
  int32_t id;
  uint64_t memory;
  std::string cpus;
};
struct TopoDevice {
  int32_t index;
  std::string name;
  std::string pci;
  int32_t numa_node;
};
struct Topology {
  std::string source;
  std::vector<TopoNode> nodes;
  std::vector<TopoDevice> gpus;
  std::vector<TopoDevice> nvme;
};

struct SnapshotInfo {
  uint64_t snapshot_id;
  uint64_t bytes;
  uint64_t stall_us;
};
struct SnapshotOptions {
  uint64_t tag = 0;   // a label of the caller's (e.g. a training step); 0: none
  uint32_t keep = 1;  // durable snapshots of the pool kept once this one is durable (1..16)
};
struct SnapshotEntry {
  uint64_t snapshot_id;
  uint64_t tag;
  uint64_t bytes;
};
struct PoolSnapshots {
  // A tierd restart rebuilt the pool after its RAM was lost (a reboot), and it has not been
  // restored since: its bytes are snapshot `recovered_from` (0: none) plus the tensors' newer
  // NVMe copies, i.e. not one point in time; `lost` tensors could not be brought back.
  bool recovered = false;
  uint64_t recovered_from = 0;
  uint64_t lost = 0;
  std::vector<SnapshotEntry> snapshots;  // durable ones, oldest first
};
struct RestoreInfo {
  uint64_t tensors;
  uint64_t bytes;
  uint64_t deleted;
  uint64_t dropped_snapshots;
};

class TIER_EXPORT Client {
 public:
  // Connects and says hello. socket_path empty: default_socket_path().
  [[nodiscard]] static Result<std::unique_ptr<Client>> connect(std::string_view socket_path = {},
                                                               const ConnectOptions& opts = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Pools. A pool belongs to the uid that created it.
  [[nodiscard]] Result<PoolInfo> create_pool(std::string_view name, const PoolOptions& opts = {},
                                             bool exist_ok = false);
  [[nodiscard]] Result<PoolInfo> open_pool(std::string_view name);
  [[nodiscard]] Result<std::vector<PoolInfo>> list_pools();
  // Frees the pool's RAM and NVMe and forgets its tensors. Fails with kBusy while leased.
  [[nodiscard]] Status drop_pool(std::string_view name);

  // Tensors.
  [[nodiscard]] Result<TensorInfo> create_tensor(std::string_view pool, const TensorDesc& desc,
                                                 bool exist_ok = false);
  [[nodiscard]] Result<TensorInfo> open_tensor(std::string_view pool, std::string_view name);
  [[nodiscard]] Result<std::vector<TensorInfo>> list_tensors(std::string_view pool);
  [[nodiscard]] Status delete_tensor(std::string_view pool, std::string_view name);

  // Leases. A batch is granted whole or not at all, in request order.
  [[nodiscard]] Result<Lease> lease(uint64_t tensor_id, LeaseMode mode, LeaseWait wait = {});
  [[nodiscard]] Result<std::vector<Lease>> lease_batch(std::span<const uint64_t> tensor_ids, LeaseMode mode,
                                                       LeaseWait wait = {});
  // Releases every valid lease in `leases` in one round trip; they become invalid.
  [[nodiscard]] Status release_batch(std::span<Lease> leases);

  // Tiering (NVMe tier). prefetch is asynchronous: it returns once the daemon has queued it.
  [[nodiscard]] Status prefetch(std::string_view pool, std::span<const uint64_t> tensor_ids);
  // Writes back and drops from RAM the given tensors (all unleased ones when empty).
  [[nodiscard]] Status evict(std::string_view pool, std::span<const uint64_t> tensor_ids = {});
  // The bytes of these tensors are no longer needed (like a TRIM): tierd may then drop a RAM
  // copy without writing it back, falling back to the tensor's last written-back bytes, or to
  // zeros when it has none. Until the tensor is next written its contents are unspecified
  // (current, older or zero bytes). Tensors under a write lease are left alone. A hint: it
  // never loses bytes written after it.
  [[nodiscard]] Status discard(std::string_view pool, std::span<const uint64_t> tensor_ids);
  // Registers one step's ordered tensor uses; the daemon keeps the next `budget` bytes of the
  // plan resident and evicts by farthest next use. Replaces any earlier plan of this client.
  [[nodiscard]] Status set_plan(std::string_view pool, std::span<const uint64_t> tensor_ids,
                                uint64_t budget = 0);
  // The same, with uses marked as overwrites (the use writes every byte under a kOverwrite
  // lease): the daemon never fetches a tensor for such a use and drops its RAM copy first.
  [[nodiscard]] Status set_plan(std::string_view pool, std::span<const PlanUse> uses, uint64_t budget = 0);
  // A consistent, durable copy of the pool; returns once it is durable.
  [[nodiscard]] Result<SnapshotInfo> snapshot(std::string_view pool);
  // The same, tagged, keeping the pool's newest opts.keep durable snapshots (a tierd that
  // predates tagged snapshots answers kProtocol, "unknown message type", and disconnects).
  [[nodiscard]] Result<SnapshotInfo> snapshot(std::string_view pool, const SnapshotOptions& opts);
  [[nodiscard]] Result<PoolSnapshots> list_snapshots(std::string_view pool);
  // Rolls the pool back to its durable snapshot `snapshot_id`: every tensor the snapshot holds
  // gets its bytes as of the snapshot, tensors created since are deleted, newer snapshots are
  // dropped and `recovered` is cleared. kBusy while any lease on the pool is held (all
  // checksums are verified before anything changes: kCorruption leaves the pool as it was).
  [[nodiscard]] Result<RestoreInfo> restore_snapshot(std::string_view pool, uint64_t snapshot_id);

  // Node inspection.
  [[nodiscard]] Result<NodeStatus> status();
  [[nodiscard]] Result<Topology> topology();
  [[nodiscard]] Result<std::string> metrics();  // Prometheus text exposition

  // The arena mapping that backs a lease: base address and size (for cudaHostRegister).
  // read_only: mapped without write access (a group reader's mapping; register it with
  // cudaHostRegisterReadOnly).
  struct ArenaMapping {
    uint64_t arena_id;
    std::byte* base;
    uint64_t size;
    int32_t numa_node;
    bool read_only = false;
  };
  [[nodiscard]] std::vector<ArenaMapping> mapped_arenas() const;
  // Tells tierd that `range` (inside one mapped arena) is pinned for DMA by this process, e.g.
  // with cudaHostRegister (pinned = true), or no longer (false). tierd then never punches the
  // range's pages out of the arena when it evicts, so a device keeps reading and writing the
  // arena's own pages after an evict and refetch. Pin before registering, unpin after
  // unregistering. The pin lasts until unpinned or until this client is destroyed; after a
  // tierd restart the client pins again what it holds in arenas that are still the same
  // object. kNotFound: no mapped arena holds the whole range, or (unpin) no such pin.
  [[nodiscard]] Status pin_for_dma(std::span<const std::byte> range, bool pinned);

  const std::string& socket_path() const noexcept;

 private:
  friend class Lease;
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  Status release_one(const Lease& lease);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tier
