#include "daemon/state.hpp"

#include <grp.h>

#include "daemon/log.hpp"

namespace tier::daemon {

Result<std::unique_ptr<DaemonState>> make_state(Config cfg, ResolvedSizes sizes) {
  auto st = std::make_unique<DaemonState>();
  auto topo = make_topology_source(cfg.topology)->load();
  if (!topo) return fail(topo.error());
  st->topology = std::move(*topo);
  if (!cfg.admin_group.empty()) {
    group* g = ::getgrnam(cfg.admin_group.c_str());
    if (!g) return fail(Code::kInvalidArgument, "admin_group '" + cfg.admin_group + "' does not exist");
    st->admin_gid = g->gr_gid;
  }
  RamTierOptions ro;
  ro.prefix = arena_prefix(cfg.state_dir);
  ro.capacity = sizes.ram;
  ro.alignment = sizes.alignment;
  ro.hugepages = cfg.hugepages;
  ro.hugetlbfs_mount = cfg.hugetlbfs_mount;
  ro.prefault = cfg.prefault;
  if (Status hs = check_hugepages(cfg.hugepages, cfg.hugetlbfs_mount); !hs) return fail(std::move(hs));
  if (cfg.hugepages != HugePages::kNone && ro.hugetlbfs_mount.empty()) {
    auto m = find_hugetlbfs(cfg.hugepages);
    if (!m) return fail(m.error());
    ro.hugetlbfs_mount = *m;
  }
  st->ram = std::make_unique<RamTier>(std::move(ro), st->topology);
  if (!cfg.nvme.empty()) {
    auto tm = NvmeTier::open(cfg, st->catalog, *st->ram);
    if (!tm) return fail(tm.error());
    st->tiering = std::move(*tm);
  }
  st->config = std::move(cfg);
  st->sizes = sizes;
  return st;
}

}  // namespace tier::daemon
