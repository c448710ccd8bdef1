#include "tiering/admission.hpp"

#include <string>

#include "tiering/nvme_tier.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

std::optional<uint64_t> round_up_checked(uint64_t size, uint64_t align) noexcept {
  const uint64_t r = (size + align - 1) & ~(align - 1);
  if (r < size) return std::nullopt;  // wrapped past 2^64
  return r;
}

namespace {

Status never(std::string_view name, uint64_t size, const std::string& why) {
  const std::string what = name.empty() ? "a tensor" : "tensor '" + std::string(name) + "'";
  return Status(Code::kResourceExhausted, what + " of " + format_size(size) + " can never be leased: " + why);
}

}  // namespace

Status ram_admits(const RamTier& ram, const Pool& pool, int32_t node, uint64_t size, std::string_view name) {
  const NodeUsage* nu = nullptr;
  for (const NodeUsage& n : ram.nodes())
    if (n.node == node) nu = &n;
  if (!nu) return Status(Code::kInvalidArgument, "NUMA node " + std::to_string(node) + " has no RAM tier");
  auto need = round_up_checked(size, ExtentAllocator::kGranule);
  if (!need || *need > pool.ram_quota)
    return never(name, size,
                 "a lease needs it whole in RAM and it is larger than pool '" + pool.name +
                     "''s RAM quota of " + format_size(pool.ram_quota));
  if (const uint64_t uq = ram.options().uid_quota; uq > 0 && pool.owner_uid != 0 && *need > uq)
    return never(name, size,
                 "a lease needs it whole in RAM and it is larger than uid " + std::to_string(pool.owner_uid) +
                     "'s RAM quota of " + format_size(uq) + " (uid_ram_quota)");
  if (*need > nu->capacity)
    return never(name, size,
                 "a lease needs it whole in RAM and it is larger than the RAM tier of NUMA node " +
                     std::to_string(node) + " (" + format_size(nu->capacity) + ")");
  return Status::ok();
}

Status admit_tensor(const RamTier& ram, const NvmeTier* tier, const Pool& pool, int32_t node, uint64_t size,
                    std::string_view name) {
  TIER_TRY(ram_admits(ram, pool, node, size, name));
  if (tier) TIER_TRY(tier->nvme_admits(pool, size, name));
  return Status::ok();
}

}  // namespace tier::daemon
