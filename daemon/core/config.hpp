// tierd configuration: a TOML file (see tierd.toml.example), overridden by command-line flags.
//
// parse_config() is pure (no I/O) so the fuzz target and the unit tests can feed it any text;
// load_config() reads a file and calls it. Sizes stay as text until resolve_sizes() applies them
// to the machine's MemTotal, so "80%" means 80 % of this node's RAM. Unknown keys are errors
// that name the key: a typo must not silently fall back to a default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tier/status.hpp"

namespace tier::daemon {

enum class HugePages : uint8_t { kNone = 0, k2M = 1, k1G = 2 };
[[nodiscard]] std::string_view hugepages_name(HugePages h) noexcept;
[[nodiscard]] uint64_t hugepage_bytes(HugePages h) noexcept;  // 0 for kNone

struct NvmeDir {
  std::string path;
  int32_t numa_node = -1;  // -1: taken from the topology (the device's nearest node) later
};

struct Config {
  // Control socket; empty: $TIERD_SOCKET, else /run/tierd/tierd.sock (see resolve_socket).
  std::string socket;
  // Where tierd keeps its state; also names its shared-memory arenas (see ram/arena.hpp).
  std::string state_dir = "/var/lib/tierd";
  // Total RAM tier, split across NUMA nodes in proportion to their memory: bytes or % of MemTotal.
  std::string ram = "50%";
  // Default RAM quota of a pool created with quota 0: bytes or % of the RAM tier.
  std::string pool_quota = "100%";
  // Default NVMe quota of a pool created with quota 0: bytes or % of the NVMe tier.
  std::string nvme_pool_quota = "100%";
  HugePages hugepages = HugePages::kNone;
  // hugetlbfs mount for hugepages != none; empty: the first matching mount in /proc/mounts.
  std::string hugetlbfs_mount;
  // Extent alignment for tensors of at least this size (power of two, 4K..1G).
  std::string alignment = "2M";
  // "" = this machine (hwloc); "synthetic:DESC" = hwloc synthetic; anything else = an XML file.
  std::string topology;
  std::vector<NvmeDir> nvme;
  // Members of this group (by the peer's primary gid) may inspect and drop any pool, like root.
  std::string admin_group;
  // Send WATCHDOG=1 when systemd asks for it (WATCHDOG_USEC).
  bool watchdog = true;
  // How often STATUS= is refreshed for systemd, in ms.
  uint32_t status_interval_ms = 5000;
  uint32_t max_clients = 4096;
  uint32_t max_leases_per_client = 1u << 20;
  // Unlink this daemon's arenas on a clean exit. Off in production: a restarted tierd
  // re-attaches them. Tests turn it on.
  bool remove_arenas_on_exit = false;
  std::string log_level = "info";  // error|warning|info|debug
  // NVMe tier (used only when `nvme` lists directories). Above ram_high_watermark of a NUMA
  // node's RAM tier, unleased tensors are written back and dropped until ram_low_watermark.
  double ram_high_watermark = 0.90;
  double ram_low_watermark = 0.80;
  // While the NVMe device is idle, planned tensors whose bytes a plan reads later are written
  // back ahead of need (farthest next read first, kept in RAM) until such dirty copies are at
  // most this fraction of their node's RAM tier and of their pool's RAM quota: the eviction
  // that later needs their room then drops them without waiting for a write. 1 turns it off.
  double ram_dirty_background = 0.25;
  // Bytes each NVMe directory may use; empty: 90% of its filesystem's free space.
  std::string nvme_capacity;
  // Threads that checksum spilled and fetched extents (0: the I/O loop's thread hashes). One
  // hashes about as fast as a core reads memory (tier-bench nvme's nvme.hash; docs/benchmarks.md):
  // size it to the tier's devices, about one per 8 GB/s of NVMe bandwidth. At most 256.
  uint32_t nvme_hash_threads = 2;
  // Write-behind flush: after this many bytes of spill writes to one NVMe data file, tierd
  // issues an fdatasync without waiting for it, so that a long spill is persisted as it
  // streams and the flush it waits for at its end has only the tail left (docs/nvme.md). Bytes,
  // written "64M" or as an integer; 0 turns it off.
  uint64_t nvme_flush_behind = uint64_t{64} << 20;
  // Per-uid quotas over all the pools a uid owns (docs/daemon.md, "Tenant limits"); root is
  // not limited; "" or 0 = unlimited. RAM: bytes or % of the RAM tier, what the uid's pools
  // hold in RAM (pinned pages included), checked at every allocation: past it the uid's own
  // tensors are evicted to NVMe, and only when none can be is the allocation refused. NVMe:
  // bytes or % of the NVMe tier, reserved from the pools' NVMe quotas (a pool created without
  // one gets a quarter of it, at most what is left). Three quarters by default: one tenant
  // keeps most of a tier, and every other uid always finds a quarter it cannot take.
  std::string uid_ram_quota = "75%", uid_nvme_quota = "75%";
  uint32_t max_connections_per_uid = 1024;
  // Tenant limits (docs/daemon.md, "Tenant limits"). Per-uid defaults are finite. Pools one
  // uid may own (root is not limited).
  uint32_t max_pools_per_uid = 64;
  // Bytes of arenas one uid may have pinned for DMA (ArenaPin), over all its connections:
  // bytes or % of the RAM tier; "" = unlimited. Pinned pages count as their pool's RAM.
  std::string uid_pinned_quota = "50%";
  // Replies queued for clients that do not read them: at most this many bytes per connection
  // (tierd stops reading its requests until the queue drains) and per uid over all its
  // connections (past it, the connection whose queue is longest is closed).
  uint64_t max_reply_bytes_per_connection = uint64_t{4} << 20;
  uint64_t max_reply_bytes_per_uid = uint64_t{64} << 20;
  // The metrics HTTP endpoint (metrics_listen) serves per-pool series (pool names and owner
  // uids) only when this is on; the Metrics request always filters by the caller's rights.
  bool metrics_http_per_pool = false;
  // Lease requests one client may have waiting at once.
  uint32_t max_waiters_per_client = 64;
  // After a restart, how long a write lease held when the previous tierd died stays reserved
  // for its holder to reclaim (docs/daemon.md, "Leases across a restart"); 0: not at all.
  uint32_t lease_reclaim_timeout_ms = 60000;
  // Uses in one client's plan (PlanSet): bounds the daemon memory a plan takes (about 40 bytes a
  // use) and the work of each scheduling pass over it.
  uint32_t max_plan_uses = 4096;
  // The state dir's file system (daemon/durability/state_space.hpp): a snapshot is refused when it would
  // leave less than snapshot_free_floor free (bytes or % of that file system), and the journal
  // keeps journal_reserve preallocated for when the disk fills anyway.
  std::string snapshot_free_floor = "5%";
  std::string journal_reserve = "64M";
  // "127.0.0.1:9464": serve Prometheus metrics over HTTP on this loopback address; "" = off.
  std::string metrics_listen;
  // Populate every arena page at creation (daemon/tiering/ram/prefault.hpp).
  bool prefault = false;
};

// Sizes resolved against this machine.
struct ResolvedSizes {
  uint64_t ram = 0;
  uint64_t pool_quota = 0;
  uint64_t alignment = 0;
  // 0: unlimited. A uid_nvme_quota in % is resolved by make_state(), against the NVMe tier.
  uint64_t uid_ram_quota = 0, uid_nvme_quota = 0;
  uint64_t uid_pinned_quota = UINT64_MAX;  // UINT64_MAX: unlimited
};

// The tenant limits of a resolved configuration, one "name value" line each, as
// --check-config prints them (docs/daemon.md, "Tenant limits").
[[nodiscard]] std::string describe_limits(const Config& cfg, const ResolvedSizes& sizes);

// Parses TOML text into a Config starting from the defaults. Pure.
[[nodiscard]] Result<Config> parse_config(std::string_view toml_text);
// Reads `path` and parses it; the error names the file.
[[nodiscard]] Result<Config> load_config(const std::string& path);

// Command-line flags; each set field replaces the config value, nvme_dirs are appended.
struct Overrides {
  std::optional<std::string> socket, state_dir, ram, pool_quota, hugepages, topology;
  std::vector<std::string> nvme_dirs;
  std::optional<bool> remove_arenas_on_exit;
};
[[nodiscard]] Status apply_overrides(Config& cfg, const Overrides& o);

// Checks what needs the file system: the NVMe directories exist and are directories (and
// check_nvme_dirs), the state directory exists or can be created. Not pure: creates a missing
// state directory unless `create_state_dir` is false (--check-config writes nothing; it then
// only checks that the nearest existing ancestor is a directory).
[[nodiscard]] Status check_paths(const Config& cfg, bool create_state_dir = true);
// The NVMe directories name distinct file systems: one directory listed twice (by any path
// to it) or two on one file system (same st_dev) would count that file system's space twice.
[[nodiscard]] Status check_nvme_dirs(const std::vector<NvmeDir>& dirs);
// A control socket path fits sockaddr_un::sun_path (at most 107 bytes) and is not empty.
// The server's bind and --check-config both use it.
[[nodiscard]] Status check_socket_path(const std::string& path);

[[nodiscard]] Result<ResolvedSizes> resolve_sizes(const Config& cfg, uint64_t mem_total);
// MemTotal from /proc/meminfo.
[[nodiscard]] Result<uint64_t> read_mem_total();
// --socket / config value, else $TIERD_SOCKET, else /run/tierd/tierd.sock.
[[nodiscard]] std::string resolve_socket(const Config& cfg);
[[nodiscard]] Result<HugePages> parse_hugepages(std::string_view s);

}  // namespace tier::daemon
