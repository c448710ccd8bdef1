// Small value types shared by the client API and the wire protocol.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tier/status.hpp"

namespace tier {

// Wire-visible numeric values.
enum class DType : uint8_t {
  kBytes = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF64 = 4,
  kI32 = 5,
  kI64 = 6,
  kU8 = 7,
  kI8 = 8,
};
inline constexpr uint8_t kMaxDType = 8;
[[nodiscard]] TIER_EXPORT std::string_view dtype_name(DType d) noexcept;
[[nodiscard]] TIER_EXPORT std::optional<DType> dtype_from_name(std::string_view s) noexcept;
[[nodiscard]] TIER_EXPORT size_t dtype_size(DType d) noexcept;  // 1 for kBytes

// kRead: shared. kWrite: exclusive, the bytes at grant are the tensor's. kOverwrite: exclusive,
// and the holder promises to write every byte before releasing: the bytes at grant are
// unspecified (stale bytes of the same pool, or zeros), so a tensor that is only on NVMe gets
// RAM without being read back. A holder that breaks the promise leaves those bytes in the tensor.
enum class LeaseMode : uint8_t { kRead = 1, kWrite = 2, kOverwrite = 3 };
inline constexpr uint8_t kMaxLeaseMode = 3;
[[nodiscard]] constexpr bool is_write(LeaseMode m) noexcept { return m != LeaseMode::kRead; }

// One use of a tensor in a plan (Client::set_plan).
struct PlanUse {
  uint64_t tensor_id = 0;
  bool overwrite = false;  // the use writes every byte under a kOverwrite lease, reads none
};

// Where a new tensor's RAM copy goes.
struct Placement {
  enum class Kind : uint8_t { kAny = 0, kNode = 1, kNearGpu = 2 };
  Kind kind = Kind::kAny;  // kAny: the NUMA node of the client's CPU at request time
  int32_t index = -1;      // NUMA node for kNode, GPU index for kNearGpu

  static Placement any() { return {}; }
  static Placement node(int32_t n) { return {Kind::kNode, n}; }
  static Placement near_gpu(int32_t g) { return {Kind::kNearGpu, g}; }
};

// What a tensor of `size` bytes takes of its pool's quota and of a tier: its size rounded up to
// this granule (tierd's RAM arenas and NVMe extents are carved in 4 KiB granules). A planner
// that adds up round_up(size, kTensorGranule) over a job's tensors gets the pool's usage exactly.
inline constexpr uint64_t kTensorGranule = 4096;
[[nodiscard]] constexpr uint64_t tensor_charge(uint64_t size) noexcept {
  return (size + kTensorGranule - 1) / kTensorGranule * kTensorGranule;
}

struct TensorDesc {
  std::string name;             // 1..255 bytes, no '/' or NUL
  uint64_t size = 0;            // bytes, > 0
  DType dtype = DType::kBytes;  // metadata only
  std::vector<int64_t> shape;   // metadata only; at most 8 dims
  Placement placement;
};

// Bits of TensorInfo::tiers.
inline constexpr uint8_t kTierRam = 1;
inline constexpr uint8_t kTierNvme = 2;

struct TensorInfo {
  uint64_t id = 0;  // unique within the daemon's lifetime and across restarts
  std::string name;
  uint64_t size = 0;
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;
  int32_t numa_node = -1;  // node of the RAM copy, -1 when not in RAM
  uint8_t tiers = 0;       // kTierRam | kTierNvme
  bool dirty = false;      // RAM copy newer than the NVMe copy
  uint32_t readers = 0;    // read leases held now
  bool writer = false;     // a write lease is held now
};

struct PoolOptions {
  uint64_t ram_quota = 0;       // bytes; 0 = the daemon's default pool quota
  uint64_t nvme_quota = 0;      // bytes; 0 = the daemon's default NVMe quota
  uint32_t group = UINT32_MAX;  // with group_read: members of this gid may read the pool
  bool group_read = false;
};

struct PoolInfo {
  uint64_t id = 0;
  std::string name;  // 1..255 bytes, [A-Za-z0-9._-]
  uint32_t owner_uid = 0;
  uint64_t ram_quota = 0;
  uint64_t nvme_quota = 0;
  uint64_t ram_used = 0;
  uint64_t nvme_used = 0;
  uint64_t tensor_count = 0;
  uint32_t group = UINT32_MAX;  // UINT32_MAX: no group access
  bool group_read = false;
};

}  // namespace tier
