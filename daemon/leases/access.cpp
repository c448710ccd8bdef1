#include "leases/access.hpp"

#include <algorithm>

namespace tier::daemon {

bool in_group(const PeerCreds& p, gid_t g) noexcept {
  if (g == kNoGroup) return false;
  return p.gid == g || std::find(p.groups.begin(), p.groups.end(), g) != p.groups.end();
}

bool is_admin(const PeerCreds& p, gid_t admin_gid) noexcept { return p.uid == 0 || in_group(p, admin_gid); }

bool is_group_reader(const PeerCreds& p, const Pool& pool) noexcept {
  return pool.group_read && in_group(p, pool.group);
}

Status check_right(const PeerCreds& p, const Pool& pool, Right r, gid_t admin_gid) {
  if (p.uid == pool.owner_uid) return Status::ok();
  switch (r) {
    case Right::kInspect:
      if (is_admin(p, admin_gid) || is_group_reader(p, pool)) return Status::ok();
      break;
    case Right::kRead:
      if (is_group_reader(p, pool)) return Status::ok();
      break;
    case Right::kUse: break;
  }
  std::string why = "pool '" + pool.name + "' belongs to uid " + std::to_string(pool.owner_uid);
  if (r == Right::kRead && pool.group_read) why += " (group " + std::to_string(pool.group) + " may read)";
  else if (r == Right::kUse && (is_admin(p, admin_gid) || is_group_reader(p, pool)))
    why += " (you may only inspect it)";
  return Status(Code::kPermissionDenied, std::move(why));
}

bool may_see(const PeerCreds& p, const Pool& pool, gid_t admin_gid) noexcept {
  return p.uid == pool.owner_uid || is_admin(p, admin_gid) || is_group_reader(p, pool);
}

bool UidTable::add_connection(uid_t uid, uint32_t limit) {
  uint32_t& n = conns_[uid];
  if (n >= limit) return false;
  ++n;
  return true;
}

void UidTable::remove_connection(uid_t uid) {
  auto it = conns_.find(uid);
  if (it == conns_.end()) return;
  if (--it->second == 0) conns_.erase(it);
}

uint32_t UidTable::connections(uid_t uid) const {
  auto it = conns_.find(uid);
  return it == conns_.end() ? 0 : it->second;
}

UidUsage uid_usage(Catalog& catalog, uid_t uid) {
  UidUsage u;
  for (const auto& [name, id] : catalog.pool_names()) {
    const Pool* p = catalog.find_pool(id);
    if (!p || p->owner_uid != uid) continue;
    u.ram_used += p->ram_charged();
    u.nvme_used += p->nvme_used;
    u.nvme_quota += p->nvme_quota;
    u.pools++;
  }
  return u;
}

}  // namespace tier::daemon
