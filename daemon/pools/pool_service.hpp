// PoolService: what creating and dropping pools and tensors does to the tiers, under the
// node's rules — a pool's RAM quota against the RAM tier, the per-uid NVMe and RAM quotas,
// group access, a tensor's admission (it must fit a lease some day) and placement, and the
// journal records of each change.
//
// The request handler decides who may ask (daemon/leases/access.hpp) and answers; this class decides
// what happens and keeps the catalog, the tiers and the journal in step. Not thread-safe: the
// event loop is the only caller.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include <memory>

#include "core/catalog.hpp"
#include "core/config.hpp"
#include "core/topology.hpp"
#include "ram/ram_tier.hpp"
#include "tiering/nvme_tier.hpp"
#include "wire/messages.hpp"

namespace tier::daemon {

class Durability;

class PoolService {
 public:
  // What the service works on, owned by the daemon and outliving it; the durability and the
  // NVMe tier through their owners' pointers (null: none; durability may come later).
  struct Parts {
    const Config& config;
    const ResolvedSizes& sizes;
    const Topology& topology;
    Catalog& catalog;
    const std::unique_ptr<RamTier>& ram;
    const std::unique_ptr<Durability>& durable;
    const std::unique_ptr<NvmeTier>& tiering;
  };

  explicit PoolService(Parts parts) : parts_(parts) {}

  // A new pool owned by `owner` (the name is valid and unused): kResourceExhausted when its
  // RAM quota exceeds the RAM tier or the owner's NVMe reservation (uid_nvme_quota) is spent,
  // kInvalidArgument for group reading without a group.
  [[nodiscard]] Result<Pool*> create_pool(uid_t owner, const wire::PoolCreateReq& req);
  // kResourceExhausted when `owner` (not root) owns max_pools_per_uid pools already, or the
  // requested NVMe quota is larger than the NVMe tier.
  [[nodiscard]] Status check_pool_limits(uid_t owner, const wire::PoolCreateReq& req);
  // Drops `p`, which holds no leases: its tensors leave every tier, its arenas go, the journal
  // records it. A million-tensor pool is dropped without freeing extents one by one.
  void drop_pool(Pool& p, uid_t by);

  // A new tensor in `p` (the request is valid, the name unused), placed by `req`'s placement
  // for a client on `client_node`: refused when no lease could ever hold it, or when RAM is
  // short (the pool's, its owner's uid_ram_quota or the node's) and nothing of the pool, the
  // owner or the node can be evicted. It starts in RAM, or in no tier when an NVMe tier is
  // still writing back the room it needs (it reads as zeros and gets RAM at its first lease).
  [[nodiscard]] Result<Tensor*> create_tensor(Pool& p, wire::TensorCreateReq& req, int32_t client_node);
  // Deletes unleased `t` of `p`: its tiers, its journal record, its catalog entry.
  void erase_tensor(Pool& p, Tensor& t);

 private:
  Parts parts_;
};

}  // namespace tier::daemon
