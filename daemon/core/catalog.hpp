// The catalog: pools and their tensors, the metadata tierd serves. Pure bookkeeping: bytes
// live in arenas (ram/) and on NVMe, placed by others; this keeps where they are.
//
// Ids: pool and tensor ids are u64, monotonically increasing and never reused within the
// catalog's lifetime (the journal persists the counters later). Tensor lookup by id is O(1)
// (a global hash index) and by name O(1) per pool; listing by id is ordered (a per-pool
// std::map), which pages naturally. Tensor and Pool addresses are stable until deleted.
// Not thread-safe: owned by the daemon's event loop.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "nvme/location.hpp"
#include "tier/status.hpp"
#include "tier/types.hpp"

namespace tier::daemon {

struct RamLocation {
  uint64_t arena_id = 0;
  int32_t node = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // allocated bytes (>= the tensor's size)
};

// The tensor's NVMe copy: its extents and checksums, as the NVMe engine wrote them
// (daemon/tiering/nvme/location.hpp). Filled in by the NVMe tier (daemon/tiering/nvme_tier.hpp).
using NvmeLocation = nvme::NvmeLocation;

struct Tensor {
  uint64_t id = 0;
  uint64_t pool_id = 0;
  std::string name;
  uint64_t size = 0;
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;
  int32_t node = -1;  // the NUMA node chosen at create
  std::optional<RamLocation> ram;
  std::optional<NvmeLocation> nvme;
  bool dirty = false;    // RAM copy newer than NVMe
  uint32_t readers = 0;  // read leases held
  bool writer = false;   // a write lease is held
};

// A pool's group when it has none.
inline constexpr gid_t kNoGroup = static_cast<gid_t>(-1);

struct Pool {
  uint64_t id = 0;
  std::string name;
  uid_t owner_uid = 0;
  uint64_t ram_quota = 0, nvme_quota = 0;
  uint64_t ram_used = 0, nvme_used = 0;  // allocated bytes
  // Pinned pages of its arenas that no extent holds (daemon/tiering/ram/ram_tier.hpp): resident, so
  // they count against its RAM quota with ram_used.
  uint64_t ram_pinned = 0;
  [[nodiscard]] uint64_t ram_charged() const noexcept { return ram_used + ram_pinned; }
  uint64_t leases = 0;                 // leases held on its tensors
  std::map<uint64_t, Tensor> tensors;  // by id
  std::unordered_map<std::string, uint64_t> by_name;
  gid_t group = kNoGroup;
  bool group_read = false;  // members of `group` may read (daemon/leases/access.hpp)
};

class Catalog {
 public:
  [[nodiscard]] Result<Pool*> create_pool(std::string name, uid_t owner, uint64_t ram_quota,
                                          uint64_t nvme_quota);
  [[nodiscard]] Pool* find_pool(std::string_view name) noexcept;
  [[nodiscard]] Pool* find_pool(uint64_t id) noexcept;
  // Removes the pool and all its tensors; the caller has freed their storage first.
  void erase_pool(uint64_t id);

  [[nodiscard]] Result<Tensor*> create_tensor(Pool& pool, TensorDesc desc, int32_t node);
  [[nodiscard]] Tensor* find_tensor(uint64_t id) noexcept;
  [[nodiscard]] Tensor* find_tensor(Pool& pool, std::string_view name) noexcept;
  void erase_tensor(Pool& pool, uint64_t id);

  // Pools ordered by name.
  const std::map<std::string, uint64_t, std::less<>>& pool_names() const noexcept { return by_name_; }
  size_t pool_count() const noexcept { return pools_.size(); }
  size_t tensor_count() const noexcept { return tensors_.size(); }
  uint64_t next_pool_id() const noexcept { return next_pool_id_; }
  uint64_t next_tensor_id() const noexcept { return next_tensor_id_; }
  // Restart: the ids the next create_pool/create_tensor take (the journal's, so ids are never
  // reused across restarts).
  void set_next_ids(uint64_t pool_id, uint64_t tensor_id) noexcept {
    next_pool_id_ = pool_id;
    next_tensor_id_ = tensor_id;
  }

 private:
  std::unordered_map<uint64_t, std::unique_ptr<Pool>> pools_;
  std::map<std::string, uint64_t, std::less<>> by_name_;
  std::unordered_map<uint64_t, Tensor*> tensors_;
  uint64_t next_pool_id_ = 1;
  uint64_t next_tensor_id_ = 1;
};

[[nodiscard]] TensorInfo tensor_info(const Tensor& t);
[[nodiscard]] PoolInfo pool_info(const Pool& p);

}  // namespace tier::daemon
