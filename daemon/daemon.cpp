#include "daemon/daemon.hpp"

#include <grp.h>

#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/sizes.hpp"
#include "leases/access.hpp"

namespace tier::daemon {

Result<std::unique_ptr<DaemonState>> make_state(Config cfg, ResolvedSizes sizes) {
  auto st = std::make_unique<DaemonState>();
  auto topo = make_topology_source(cfg.topology)->load();
  TIER_TRY(topo);
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
  ro.uid_quota = sizes.uid_ram_quota;
  ro.uid_charged = [cat = &st->catalog](uid_t uid) { return uid_usage(*cat, uid).ram_used; };
  TIER_TRY(check_hugepages(cfg.hugepages, cfg.hugetlbfs_mount));
  if (cfg.hugepages != HugePages::kNone && ro.hugetlbfs_mount.empty()) {
    auto m = find_hugetlbfs(cfg.hugepages);
    TIER_TRY(m);
    ro.hugetlbfs_mount = *m;
  }
  st->ram = std::make_unique<RamTier>(std::move(ro), st->topology);
  if (!cfg.nvme.empty()) {
    auto tm = NvmeTier::open(cfg, st->catalog, *st->ram);
    TIER_TRY(tm);
    st->tiering = std::move(*tm);
  }
  if (st->tiering && cfg.uid_nvme_quota.find('%') != std::string::npos) {
    auto u = parse_size(cfg.uid_nvme_quota, st->tiering->nvme_capacity());
    if (!u) return fail(Code::kInvalidArgument, "uid_nvme_quota: " + u.error().message());
    sizes.uid_nvme_quota = *u;
  }
  st->config = std::move(cfg);
  st->sizes = sizes;
  return st;
}

Status open_durability(DaemonState& st, RecoveryReport* report) {
  DurabilityDeps deps{st.catalog,
                      *st.ram,
                      st.config.state_dir,
                      st.topology.nodes.empty() ? 0 : st.topology.nodes.front().id,
                      st.tiering ? &st.tiering->engine() : nullptr,
                      st.config.snapshot_free_floor,
                      st.config.journal_reserve};
  auto d = Durability::open(std::move(deps), report);
  TIER_TRY(d);
  // Write leases held when the previous tierd died stay reserved for their holders.
  st.reclaims.adopt(st.reclaim_parts(), **d, Clock::now());
  // The rebuild may have journaled losses; make them durable before serving.
  TIER_TRY((*d)->commit());
  st.durable = std::move(*d);
  if (st.tiering) st.tiering->set_residency_log(st.durable.get());
  return Status::ok();
}

}  // namespace tier::daemon
