// A RAM-tier arena: one named shared-memory object per (pool, NUMA node), sparse, sized to the
// pool's RAM quota, NUMA-bound before first touch, mode 0600 and owned by the pool's owner.
// Clients map it through an fd passed over the control socket (never by name).
//
// Shared-memory layout (a restarted tierd re-attaches arenas by name, so these are stable):
//   name      "/tierd-<h>-p<pool id>-n<node>" for shm_open (visible as /dev/shm/tierd-...),
//             "<hugetlbfs mount>/tierd-<h>-p<pool id>-n<node>" with huge pages,
//             where <h> is 8 lower-case hex digits of FNV-1a-32 over the absolute, normalised
//             state directory path (so daemons with different state dirs never collide);
//   arena id  (pool id << kArenaNodeBits) | node — the id clients use in MapArena;
//   size      the pool's RAM quota rounded up to kArenaSizeGranule (or the huge page size);
//   contents  tensor bytes only, at offsets kept in the catalog; no header.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/config.hpp"
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
// The object name: "tierd-1a2b3c4d-p12-n0" (no leading '/').
[[nodiscard]] std::string arena_object_name(const std::string& prefix, uint64_t pool_id, int32_t node);

// The kernel NUMA node a topology node binds to: the same number when this kernel has it,
// else -1 (no binding: the topology is simulated). Logs the degradation once per node.
[[nodiscard]] int os_node_for(int32_t node);

struct ArenaSpec {
  std::string prefix;          // arena_prefix(state dir)
  uint64_t pool_id = 0;
  int32_t node = 0;            // topology node
  uint64_t size = 0;           // bytes; rounded up to the granule
  uid_t owner = 0;
  HugePages hugepages = HugePages::kNone;
  std::string hugetlbfs_mount; // with huge pages; empty: found in /proc/mounts
  bool prefault = false;       // touch every page at creation (daemon/ram/prefault.hpp)
};

class Arena {
 public:
  // Creates the object (replacing a stale one of the same name), sizes it, binds it to the
  // node and maps it in the daemon.
  [[nodiscard]] static Result<std::unique_ptr<Arena>> create(const ArenaSpec& spec);
  // Re-attaches the existing object of `spec` (a daemon restart: the journal names it) without
  // changing its bytes. kNotFound when it does not exist (a reboot removed it); kCorruption when
  // its size is not the recorded `spec.size` (it is then left alone).
  [[nodiscard]] static Result<std::unique_ptr<Arena>> attach(const ArenaSpec& spec);
  ~Arena();  // unmaps and closes; the object itself stays (see unlink)
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  uint64_t id() const noexcept { return id_; }
  int32_t node() const noexcept { return node_; }
  int os_node() const noexcept { return os_node_; }  // -1: not bound
  uint64_t size() const noexcept { return size_; }
  int fd() const noexcept { return fd_; }
  std::byte* base() const noexcept { return base_; }
  const std::string& path() const noexcept { return path_; }
  // Removes the name; mappings and passed fds stay valid until closed.
  Status unlink();

 private:
  Arena() = default;
  [[nodiscard]] static Result<std::unique_ptr<Arena>> open_object(const ArenaSpec& spec, bool attach);
  uint64_t id_ = 0;
  int32_t node_ = 0;
  int os_node_ = -1;
  uint64_t size_ = 0;
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
// For hugepages != none: some pages of that size are reserved and free, and a hugetlbfs mount
// exists (`mount` overrides the search). kInvalidArgument saying how to fix it otherwise.
[[nodiscard]] Status check_hugepages(HugePages h, const std::string& mount);

}  // namespace tier::daemon
