// PoolService: pools and tensors created and dropped across the tiers (see pool_service.hpp).
#include "pools/pool_service.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "leases/access.hpp"
#include "tiering/admission.hpp"
#include "durability/durability.hpp"
#include "base/log.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

namespace {
// A pool created without an NVMe quota, by a uid with a uid_nvme_quota, gets this fraction of it.
constexpr uint64_t kDefaultPoolShareOfUid = 4;
}  // namespace

Status PoolService::check_pool_limits(uid_t owner, const wire::PoolCreateReq& req) {
  // Each pool promises its quotas: bounded per pool by the tiers, per uid by the pool count.
  const uint32_t max_pools = parts_.config.max_pools_per_uid;
  if (owner != 0 && uid_usage(parts_.catalog, owner).pools >= max_pools)
    return Status(Code::kResourceExhausted, "uid " + std::to_string(owner) + " owns " +
                                                std::to_string(max_pools) +
                                                " pools, the limit (max_pools_per_uid)");
  if (parts_.tiering && req.nvme_quota > parts_.tiering->nvme_capacity())
    return Status(Code::kResourceExhausted, "NVMe quota " + format_size(req.nvme_quota) +
                                                " exceeds the NVMe tier of " +
                                                format_size(parts_.tiering->nvme_capacity()));
  return Status::ok();
}

Result<Pool*> PoolService::create_pool(uid_t owner, const wire::PoolCreateReq& req) {
  uint64_t quota = req.ram_quota == 0 ? parts_.sizes.pool_quota : req.ram_quota;
  if (quota > parts_.ram->capacity())
    return fail(Code::kResourceExhausted, "RAM quota " + format_size(quota) + " exceeds the RAM tier of " +
                                              format_size(parts_.ram->capacity()));
  TIER_TRY(check_pool_limits(owner, req));
  if (req.group_read && req.group == UINT32_MAX)
    return fail(Code::kInvalidArgument, "group read access needs a group");
  uint64_t nvme_quota = req.nvme_quota;
  if (uint64_t uq = parts_.sizes.uid_nvme_quota; uq > 0 && owner != 0) {
    // Per-uid NVMe quota: the pools' NVMe quotas are reserved from it. A pool created without
    // one gets a quarter of it (at most the default pool quota and what is left), so that one
    // such pool does not take the uid's whole share from its next job.
    UidUsage u = uid_usage(parts_.catalog, owner);
    uint64_t left = u.nvme_quota >= uq ? 0 : uq - u.nvme_quota;
    if (nvme_quota == 0) {
      nvme_quota = std::min(left, std::max<uint64_t>(uq / kDefaultPoolShareOfUid, 1));
      if (parts_.tiering) nvme_quota = std::min(nvme_quota, parts_.tiering->default_nvme_quota());
    }
    if (nvme_quota == 0 || nvme_quota > left)
      return fail(Code::kResourceExhausted, "uid " + std::to_string(owner) + " has reserved " +
                                                format_size(u.nvme_quota) + " of its NVMe quota of " +
                                                format_size(uq) + " (uid_nvme_quota); " + format_size(left) +
                                                " left, " + format_size(nvme_quota) + " asked");
  }
  auto p = parts_.catalog.create_pool(req.name, owner, quota, nvme_quota);
  TIER_TRY(p);
  (*p)->group = req.group == UINT32_MAX ? kNoGroup : static_cast<gid_t>(req.group);
  (*p)->group_read = req.group_read;
  if (parts_.durable) parts_.durable->pool_created(**p);
  log_info("pool '{}' created by uid {} (RAM quota {})", req.name, owner, format_size(quota));
  return *p;
}

void PoolService::drop_pool(Pool& p, uid_t by) {
  // A million-tensor pool must not stall the loop for long: extents are not freed one by one
  // (their allocators go with the arenas), only the usage counts are taken off per node.
  std::map<int32_t, std::pair<uint64_t, uint64_t>> usage;  // node -> (bytes, extents)
  for (auto& [id, t] : p.tensors) {
    if (parts_.tiering) parts_.tiering->forget(p, t);
    if (t.ram) {
      auto& u = usage[t.ram->node];
      u.first += t.ram->length;
      u.second++;
    }
  }
  for (const auto& [node, u] : usage) parts_.ram->forget_usage(p, node, u.first, u.second);
  parts_.ram->drop_pool(p.id);
  log_info("pool '{}' dropped by uid {} ({} tensors)", p.name, by, p.tensors.size());
  if (parts_.durable) parts_.durable->pool_dropped(p);
  parts_.catalog.erase_pool(p.id);
}

Result<Tensor*> PoolService::create_tensor(Pool& p, wire::TensorCreateReq& req, int32_t client_node) {
  Placement pl{static_cast<Placement::Kind>(req.placement_kind), req.placement_index};
  auto node = choose_node(parts_.topology, pl, client_node);
  TIER_TRY(node);
  // Refused now when no lease could ever hold it (daemon/tiering/admission.hpp).
  TIER_TRY(admit_tensor(*parts_.ram, parts_.tiering.get(), p, *node, req.size, req.name));
  // The owner's uid_ram_quota is checked where RAM is allocated (RamTier::allocate): with an
  // NVMe tier, room in it is made by evicting the owner's own tensors.
  auto loc = parts_.tiering ? parts_.tiering->allocate(p, *node, req.size)
                            : parts_.ram->allocate(p, *node, req.size);
  // With an NVMe tier, room that only write-backs in flight can free is not waited for on the
  // event loop: the tensor starts in no tier (it reads as zeros, as a new tensor does) and gets
  // RAM at its first lease, which is deferred like any lease that needs room.
  const bool in_no_tier = !loc && parts_.tiering && loc.error().code() == Code::kBusy;
  if (!loc && !in_no_tier) return fail(loc.error());
  TensorDesc desc{std::move(req.name), req.size, static_cast<DType>(req.dtype), std::move(req.shape), pl};
  auto t = parts_.catalog.create_tensor(p, std::move(desc), *node);
  if (!t) {
    if (loc) parts_.ram->release(p, *loc);
    return fail(t.error());
  }
  if (loc) (*t)->ram = *loc;
  if (parts_.durable) parts_.durable->tensor_created(**t);
  return *t;
}

void PoolService::erase_tensor(Pool& p, Tensor& t) {
  if (parts_.tiering) parts_.tiering->forget(p, t);
  if (t.ram) parts_.ram->release(p, *t.ram);
  if (parts_.durable) parts_.durable->tensor_deleted(t);
  parts_.catalog.erase_tensor(p, t.id);
}

}  // namespace tier::daemon
