// An offset-space allocator for one arena: hands out [offset, offset + size) ranges of a fixed
// capacity. Best fit with immediate coalescing of neighbouring free ranges.
//
// Free ranges live in two indexes: by offset (to find neighbours when freeing) and by
// (size, offset) (to find the best fit). Every operation is O(log n) in the number of free
// ranges (allocate looks at a bounded number of candidates before taking one that fits for
// certain). All offsets and sizes are multiples of kGranule. Not thread-safe: the daemon's
// event loop is its only user.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tier/types.hpp"

namespace tier::daemon {

class ExtentAllocator {
 public:
  static constexpr uint64_t kGranule = 4096;
  static_assert(kGranule == kTensorGranule, "the public charge of a tensor (tier/types.hpp) is this granule");

  // `capacity` is rounded down to kGranule.
  explicit ExtentAllocator(uint64_t capacity);

  // Allocates `size` bytes (rounded up to kGranule) at an offset that is a multiple of
  // `align` (a power of two >= kGranule). nullopt when no free range fits.
  [[nodiscard]] std::optional<uint64_t> allocate(uint64_t size, uint64_t align = kGranule);
  // Frees a range returned by allocate with the same size. Returns false (and changes
  // nothing) when the range is not wholly allocated: a double free or a bad range.
  bool free(uint64_t offset, uint64_t size);
  // Marks a specific range allocated (re-attaching a catalog after a restart). False when
  // any part of it is not free.
  bool reserve(uint64_t offset, uint64_t size);

  // The free parts of [begin, end), clipped to it, ascending, as (offset, length) (pins,
  // compaction). O(log n + parts).
  [[nodiscard]] std::vector<std::pair<uint64_t, uint64_t>> free_within(uint64_t begin, uint64_t end) const;

  uint64_t capacity() const noexcept { return capacity_; }
  uint64_t used() const noexcept { return used_; }
  uint64_t free_bytes() const noexcept { return capacity_ - used_; }
  size_t free_ranges() const noexcept { return by_offset_.size(); }
  uint64_t largest_free() const noexcept;
  // 1 - largest free range / free bytes: 0 when free space is one range, -> 1 when shattered.
  double fragmentation() const noexcept;

  static uint64_t round_up(uint64_t v, uint64_t a) noexcept { return (v + a - 1) & ~(a - 1); }

 private:
  void insert_free(uint64_t off, uint64_t size);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset)
};

}  // namespace tier::daemon
