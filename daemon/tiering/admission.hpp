// Admission of new tensors: a tensor that could never be leased is refused when it is created,
// not accepted and left to fail every lease (or, worse, to evict its pool's other tensors while
// it looks for room it can never get).
//
// A lease maps the whole tensor in RAM at once, so the tensor must fit its pool's RAM quota and
// its NUMA node's RAM tier, each counted in allocated bytes (the size rounded up to the RAM
// tier's granule). With the NVMe tier it must also fit its pool's NVMe quota and the NVMe tier
// (rounded up to the extent alignment), where it goes whenever it leaves RAM. These are limits
// on the size alone, not on what is in use now: a tensor that fits them but not the free room
// is a matter for eviction (or a kResourceExhausted naming what is full), not for admission.
// All arithmetic is overflow-safe: any u64 size (2^63 from a raw client) gets a clear refusal.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/catalog.hpp"
#include "ram/ram_tier.hpp"
#include "tier/status.hpp"

namespace tier::daemon {

class NvmeTier;

// `size` rounded up to a multiple of `align` (a power of two); nullopt when that overflows.
[[nodiscard]] std::optional<uint64_t> round_up_checked(uint64_t size, uint64_t align) noexcept;

// kResourceExhausted naming the limit when a tensor of `size` bytes can never be in RAM in
// `pool` on `node` (the pool's RAM quota, the node's RAM tier); kInvalidArgument for a node
// without a RAM tier. `name` is the tensor's, for the message (empty: "a tensor").
[[nodiscard]] Status ram_admits(const RamTier& ram, const Pool& pool, int32_t node, uint64_t size,
                                std::string_view name);

// ram_admits() and, with the NVMe tier (`tier` not null), NvmeTier::nvme_admits().
[[nodiscard]] Status admit_tensor(const RamTier& ram, const NvmeTier* tier, const Pool& pool, int32_t node,
                                  uint64_t size, std::string_view name);

}  // namespace tier::daemon
