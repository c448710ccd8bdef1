// Where a tensor's bytes live on the NVMe tier, and the checksum that guards them.
//
// A location is an ordered list of extents; extent i holds the next `length` bytes of the
// tensor (the extents' lengths add up to `size`). Each extent occupies round_up(length, 4 KiB)
// bytes at `offset` in data file `file` of directory `dir` (the padding is zeros). The daemon
// records locations in its catalog and journal; these values are part of that record, so the
// field meanings must not change.
#pragma once

// On x86-64 the dispatching build picks the widest SIMD the CPU has (AVX2/AVX-512); the
// checksum values are the same XXH3_64bits either way.
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#else
#include <xxhash.h>
#endif

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tier::nvme {

// On-disk layout constant: extents start and occupy whole multiples of this.
inline constexpr uint64_t kExtentAlign = 4096;
static_assert((kExtentAlign & (kExtentAlign - 1)) == 0, "extent alignment is a power of two");

struct Extent {
  uint16_t dir = 0;       // index of the NVMe directory in the engine's configuration
  uint32_t file = 0;      // data file number: <dir>/data-<file, 6 digits>.tier
  uint64_t offset = 0;    // byte offset in that file, a multiple of kExtentAlign
  uint64_t length = 0;    // tensor bytes held (the allocation is round_up(length, kExtentAlign))
  uint64_t checksum = 0;  // XXH3_64bits (seed 0) of those `length` bytes
  bool operator==(const Extent&) const = default;
  // Field order for tier::wire::Writer/Reader (the daemon journals locations with the codec).
  template <class V> void visit(V& v) {
    v(dir);
    v(file);
    v(offset);
    v(length);
    v(checksum);
  }
};

struct NvmeLocation {
  uint64_t size = 0;
  std::vector<Extent> extents;
  bool empty() const noexcept { return extents.empty(); }
  bool operator==(const NvmeLocation&) const = default;
  template <class V> void visit(V& v) {
    v(size);
    v(extents);
  }
};

// Whether a location is self-consistent: every extent non-empty and 4 KiB-aligned, lengths
// adding up to `size`. (Whether its directories and files exist is the engine's check.)
inline bool well_formed(const NvmeLocation& loc) noexcept {
  uint64_t sum = 0;
  for (const Extent& e : loc.extents) {
    if (e.length == 0 || e.offset % kExtentAlign != 0) return false;
    sum += e.length;
  }
  return sum == loc.size;
}

inline uint64_t extent_checksum(std::span<const std::byte> bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}

inline uint64_t allocated_bytes(const Extent& e) noexcept {
  return (e.length + kExtentAlign - 1) & ~(kExtentAlign - 1);
}

}  // namespace tier::nvme
