// A RAM-tier arena: one shared-memory object per (pool, NUMA node), sparse, NUMA-bound before
// first touch, owned by tierd's uid with mode 0600. Tenants never open it by name: they map it
// through an fd passed over the control socket (MapArena), so no other uid can open it, chmod it
// or hand it on; what a tenant can still do through its fd (ftruncate) is caught by the SIGBUS
// guard (daemon/tiering/ram/fault_guard.hpp) and by the checks of attach().
//
// Shared-memory layout (a restarted tierd re-attaches arenas by the name its journal recorded):
//   name      "/tierd-<h>-p<pool id>-n<node>-<id>" for shm_open (visible as /dev/shm/tierd-...),
//             "<hugetlbfs mount>/tierd-<h>-p<pool id>-n<node>-<id>" with huge pages,
//             where <h> is 8 lower-case hex digits of FNV-1a-32 over the absolute, normalised
//             state directory path (so daemons with different state dirs never collide) and
//             <id> 32 lower-case hex digits of a random 128-bit arena identity drawn at creation
//             (getrandom): nobody can create the object before tierd does (squatting);
//   arena id  (pool id << kArenaNodeBits) | node — the id clients use in MapArena;
//   reserved  the pool's RAM quota rounded up to kArenaSizeGranule (or the huge page size): the
//             length tierd and clients map, the bound of every offset in it;
//   committed the object's size: grown (ftruncate) as extents are placed on the node, so the
//             arenas of a pool together are as large as what is placed, not one quota per
//             node; with huge pages the whole reservation (a hugetlbfs mapping sizes its file);
//   contents  tensor bytes only, at offsets kept in the catalog; no header.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <array>

#include <cstdint>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "tier/status.hpp"

namespace tier::daemon {

inline constexpr unsigned kArenaNodeBits = 16;
inline constexpr uint64_t kArenaSizeGranule = 2ull << 20;
static_assert(kArenaSizeGranule % 4096 == 0, "arena sizes are whole pages");

[[nodiscard]] constexpr uint64_t arena_id(uint64_t pool_id, int32_t node) noexcept {
  return (pool_id << kArenaNodeBits) | (static_cast<uint64_t>(node) & ((1u << kArenaNodeBits) - 1));
}
[[nodiscard]] constexpr uint64_t arena_pool(uint64_t arena) noexcept { return arena >> kArenaNodeBits; }
[[nodiscard]] constexpr int32_t arena_node(uint64_t arena) noexcept {
  return static_cast<int32_t>(arena & ((1u << kArenaNodeBits) - 1));
}
static_assert(arena_pool(arena_id(7, 1)) == 7 && arena_node(arena_id(7, 1)) == 1);

// "tierd-1a2b3c4d": the per-state-dir prefix of every arena name (no leading '/').
[[nodiscard]] std::string arena_prefix(const std::string& state_dir);
// The object name: "tierd-1a2b3c4d-p12-n0-<32 hex digits of `identity`>" (no leading '/').
[[nodiscard]] std::string arena_object_name(const std::string& prefix, uint64_t pool_id, int32_t node,
                                            const std::array<uint8_t, 16>& identity);
// Whether `name` (no directory) is a name arena_object_name() gives this (prefix, pool, node)
// for some identity.
[[nodiscard]] bool arena_name_matches(const std::string& name, const std::string& prefix, uint64_t pool_id,
                                      int32_t node);
// Whether an object tierd (effective uid `euid`) is about to re-attach is one it created: a
// regular file, owned by `euid`, mode exactly 0600, one link. kPermissionDenied naming what is
// wrong otherwise.
[[nodiscard]] Status check_arena_identity(const struct stat& sb, uid_t euid);

// The kernel NUMA node a topology node binds to: the same number when this kernel has it,
// else -1 (no binding: the topology is simulated). Logs the degradation once per node.
[[nodiscard]] int os_node_for(int32_t node);

struct ArenaSpec {
  std::string prefix;  // arena_prefix(state dir)
  uint64_t pool_id = 0;
  int32_t node = 0;   // topology node
  uint64_t size = 0;  // the reservation (the pool's RAM quota); rounded up to the granule
  HugePages hugepages = HugePages::kNone;
  std::string hugetlbfs_mount;  // with huge pages; empty: found in /proc/mounts
  bool prefault = false;        // touch every page as it is committed (daemon/tiering/ram/prefault.hpp)
  // attach(): the object's path as the journal recorded it, and the end of the last journaled
  // extent in it (the object must be at least that long).
  std::string path;
  uint64_t min_size = 0;
};

class Arena {
 public:
  // Creates a new object under a fresh random name (O_EXCL, mode 0600, tierd's uid), maps the
  // reservation in the daemon, binds it to the node; nothing is committed yet (huge pages:
  // everything).
  [[nodiscard]] static Result<std::unique_ptr<Arena>> create(const ArenaSpec& spec);
  // Re-attaches the object at `spec.path` (a daemon restart: the journal names it) without
  // changing its bytes, only when it proves to be the one tierd created: kNotFound when it does
  // not exist (a reboot removed it); kPermissionDenied when the name is not an arena name of
  // this (prefix, pool, node) or check_arena_identity() refuses it (a squatter's object: not
  // opened further, not mapped); kCorruption when its size is below `spec.min_size` or above
  // the reservation (truncated or grown through a tenant's fd). The caller decides what to do
  // with a refused object (remove_object()).
  [[nodiscard]] static Result<std::unique_ptr<Arena>> attach(const ArenaSpec& spec);
  ~Arena();  // unmaps and closes; the object itself stays (see unlink)
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  uint64_t id() const noexcept { return id_; }
  int32_t node() const noexcept { return node_; }
  int os_node() const noexcept { return os_node_; }           // -1: not bound
  uint64_t size() const noexcept { return size_; }            // the reservation (mapped length)
  uint64_t committed() const noexcept { return committed_; }  // the object's size
  // Grows the object to cover [0, end) (end <= size()): by at least a quarter of what is
  // committed, in whole granules, so a filling arena grows O(log) times; prefaults the new part
  // when configured. Errors leave the arena as it was.
  // kResourceExhausted, saying so, when the growth does not fit the free space of the object's
  // tmpfs (a sparse object would otherwise SIGBUS whoever touches a page past it).
  [[nodiscard]] Status commit(uint64_t end);
  // Faults in this arena that the SIGBUS guard repaired (a tenant truncated it).
  uint64_t repairs() const noexcept;
  int fd() const noexcept { return fd_; }
  std::byte* base() const noexcept { return base_; }
  const std::string& path() const noexcept { return path_; }
  // Removes the name; mappings and passed fds stay valid until closed.
  Status unlink();
  // Removes the object at `path` (a shm name with leading '/' or a hugetlbfs path) that attach()
  // refused. Returns whether it was removed.
  static bool remove_object(const std::string& path, bool huge);

 private:
  Arena() = default;
  [[nodiscard]] static Result<std::unique_ptr<Arena>> open_object(const ArenaSpec& spec, bool attach);
  [[nodiscard]] Status map_and_guard();
  uint64_t free_space() const;  // bytes free in the object's file system
  uint64_t id_ = 0;
  int32_t node_ = 0;
  int os_node_ = -1;
  uint64_t size_ = 0;
  uint64_t committed_ = 0;
  uint64_t granule_ = kArenaSizeGranule;
  bool prefault_ = false;
  int guard_slot_ = -1;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  bool huge_ = false;
  std::string path_;  // shm name with leading '/', or the hugetlbfs file path
};

// Unlinks every arena whose name starts with `prefix` in /dev/shm (and in `hugetlbfs_mount`
// when given). Returns how many were removed.
size_t remove_arenas(const std::string& prefix, const std::string& hugetlbfs_mount = {});

// The hugetlbfs mount for a page size from /proc/mounts, or kUnsupported with how to make one.
[[nodiscard]] Result<std::string> find_hugetlbfs(HugePages h);
// Free huge pages of that size now (0 when none are reserved).
[[nodiscard]] uint64_t free_hugepages(HugePages h);
// The /dev/shm tmpfs must hold the RAM tier (`ram` bytes; arenas live there unless huge pages
// are used): kInvalidArgument saying how to raise it when its size (statfs) is smaller by more
// than 1/64 of the tier (rounding: ram = "50%" against the usual half-RAM tmpfs passes).
// `shm_dir` is the mount to check ("/dev/shm"; tests pass another).
[[nodiscard]] Status check_shm_capacity(uint64_t ram, HugePages h, const std::string& shm_dir = "/dev/shm");
// For hugepages != none: some pages of that size are reserved and free, and a hugetlbfs mount
// exists (`mount` overrides the search). kInvalidArgument saying how to fix it otherwise.
[[nodiscard]] Status check_hugepages(HugePages h, const std::string& mount);

}  // namespace tier::daemon
