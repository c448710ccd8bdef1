// ExtentAllocator: best-fit allocation of aligned ranges in an offset space, with coalescing.
//
// Generic: it knows nothing of files or devices. The space is the union of ranges added with
// add_range(); allocations are multiples of `align` and never cross a multiple of `boundary`
// (so one allocator can manage several fixed-size files laid end to end: free neighbours in
// different files are never merged). O(log n) per operation: free ranges are indexed by offset
// (for coalescing) and by (length, offset) (for best fit; among equal lengths the lowest offset,
// which keeps data packed at the start of the space).
//
// Not thread-safe; the owner serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "tier/status.hpp"

namespace tier::nvme {

class ExtentAllocator {
 public:
  // align: a power of two; boundary: a multiple of align, or 0 for none.
  ExtentAllocator(uint64_t align, uint64_t boundary);

  // Adds [offset, offset+len) as free space. Both aligned; must not overlap existing space.
  [[nodiscard]] Status add_range(uint64_t offset, uint64_t len);
  // Best fit: the smallest free range that holds round_up(len); returns its offset.
  [[nodiscard]] std::optional<uint64_t> allocate(uint64_t len);
  // Marks [offset, offset+len) used (rebuilding state from a journal). Fails with
  // kInvalidArgument when any byte of it is not free.
  [[nodiscard]] Status reserve(uint64_t offset, uint64_t len);
  // Returns a range from allocate()/reserve(); merges it with free neighbours.
  [[nodiscard]] Status release(uint64_t offset, uint64_t len);

  uint64_t round_up(uint64_t len) const noexcept { return (len + align_ - 1) & ~(align_ - 1); }
  uint64_t capacity() const noexcept { return capacity_; }
  uint64_t free_bytes() const noexcept { return free_; }
  uint64_t used_bytes() const noexcept { return capacity_ - free_; }
  uint64_t largest_free() const noexcept;
  size_t free_ranges() const noexcept { return by_offset_.size(); }

 private:
  void insert_free(uint64_t off, uint64_t len);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);
  bool same_segment(uint64_t a_end, uint64_t b_start) const noexcept;

  uint64_t align_, boundary_;
  uint64_t capacity_ = 0, free_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace tier::nvme
