// Who may do what with a pool (docs/daemon.md, "Authorization"), and the per-uid limits.
//
// Rights, from the peer's SO_PEERCRED uid/gid and its supplementary groups (SO_PEERGROUPS, read
// once at connect):
//   kUse      the pool's owner: everything (create/delete tensors, read and write leases, map
//             arenas, prefetch, evict, plan, snapshot, drop).
//   kRead     members of the pool's group when the pool grants group read: open the pool, list
//             and open its tensors, read leases, map its arenas read-only.
//   kInspect  root and members of admin_group: open, list, inspect, drop — never lease or map.
// Anyone else: kPermissionDenied naming the owner. Pure functions of their arguments; no I/O.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>

#include "core/catalog.hpp"
#include "tier/status.hpp"

namespace tier::daemon {

struct Session;

struct PeerCreds {
  uid_t uid = 0;
  gid_t gid = 0;
  std::span<const gid_t> groups;  // supplementary groups (may include gid)
};

enum class Right : uint8_t { kInspect, kRead, kUse };

[[nodiscard]] bool in_group(const PeerCreds& p, gid_t g) noexcept;
// Root, or a member of admin_gid (primary or supplementary).
[[nodiscard]] bool is_admin(const PeerCreds& p, gid_t admin_gid) noexcept;
// Group read: the pool names a group, grants read, and the peer is in it.
[[nodiscard]] bool is_group_reader(const PeerCreds& p, const Pool& pool) noexcept;
// ok, or kPermissionDenied saying whose pool it is and what was missing.
[[nodiscard]] Status check_right(const PeerCreds& p, const Pool& pool, Right r, gid_t admin_gid);
// May the peer see the pool at all (pool list)?
[[nodiscard]] bool may_see(const PeerCreds& p, const Pool& pool, gid_t admin_gid) noexcept;

// Per-uid accounting the handler keeps: open connections. Not thread-safe (event loop only).
class UidTable {
 public:
  // false (and nothing counted) when `uid` already has `limit` connections.
  [[nodiscard]] bool add_connection(uid_t uid, uint32_t limit);
  void remove_connection(uid_t uid);
  [[nodiscard]] uint32_t connections(uid_t uid) const;

 private:
  std::unordered_map<uid_t, uint32_t> conns_;
};

// Bytes of RAM and NVMe quota/usage over every pool `uid` owns.
struct UidUsage {
  uint64_t ram_used = 0, nvme_used = 0, nvme_quota = 0, pools = 0;
};
[[nodiscard]] UidUsage uid_usage(Catalog& catalog, uid_t uid);

}  // namespace tier::daemon
