#include "nvme/extent_allocator.hpp"

#include <fmt/format.h>

namespace tier::nvme {

ExtentAllocator::ExtentAllocator(uint64_t align, uint64_t boundary) : align_(align), boundary_(boundary) {}

bool ExtentAllocator::same_segment(uint64_t a_end, uint64_t b_start) const noexcept {
  // a ends where b starts; they may merge unless that point is a segment boundary.
  (void)b_start;
  return boundary_ == 0 || a_end % boundary_ != 0;
}

void ExtentAllocator::insert_free(uint64_t off, uint64_t len) {
  by_offset_[off] = len;
  by_size_.insert({len, off});
}

void ExtentAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

Status ExtentAllocator::add_range(uint64_t offset, uint64_t len) {
  if (offset % align_ != 0 || len % align_ != 0 || len == 0)
    return {Code::kInvalidArgument, fmt::format("range {}+{} is not {}-aligned", offset, len, align_)};
  capacity_ += len;
  free_ += len;
  // Split at segment boundaries so that no free range spans two segments.
  while (len > 0) {
    uint64_t piece = len;
    if (boundary_ != 0) piece = std::min(len, boundary_ - offset % boundary_);
    insert_free(offset, piece);
    offset += piece;
    len -= piece;
  }
  return Status::ok();
}

std::optional<uint64_t> ExtentAllocator::allocate(uint64_t len) {
  len = round_up(len);
  if (len == 0) return std::nullopt;
  auto it = by_size_.lower_bound({len, 0});
  if (it == by_size_.end()) return std::nullopt;
  auto [flen, off] = *it;
  by_size_.erase(it);
  by_offset_.erase(off);
  if (flen > len) insert_free(off + len, flen - len);
  free_ -= len;
  return off;
}

Status ExtentAllocator::reserve(uint64_t offset, uint64_t len) {
  len = round_up(len);
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin())
    return {Code::kInvalidArgument, fmt::format("range {}+{} is not free", offset, len)};
  --it;
  uint64_t foff = it->first, flen = it->second;
  if (offset % align_ != 0 || offset + len > foff + flen)
    return {Code::kInvalidArgument, fmt::format("range {}+{} is not free", offset, len)};
  erase_free(it);
  if (offset > foff) insert_free(foff, offset - foff);
  if (foff + flen > offset + len) insert_free(offset + len, foff + flen - offset - len);
  free_ -= len;
  return Status::ok();
}

Status ExtentAllocator::release(uint64_t offset, uint64_t len) {
  len = round_up(len);
  if (offset % align_ != 0 || len == 0)
    return {Code::kInvalidArgument, fmt::format("release of unaligned range {}+{}", offset, len)};
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first < offset + len)
    return {Code::kInternal, fmt::format("double free of range {}+{}", offset, len)};
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset)
      return {Code::kInternal, fmt::format("double free of range {}+{}", offset, len)};
  }
  uint64_t start = offset, end = offset + len;
  if (next != by_offset_.end() && next->first == end && same_segment(end, end)) {
    end += next->second;
    erase_free(next);
  }
  auto after = by_offset_.lower_bound(start);
  if (after != by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start && same_segment(start, start)) {
      start = prev->first;
      erase_free(prev);
    }
  }
  insert_free(start, end - start);
  free_ += len;
  return Status::ok();
}

uint64_t ExtentAllocator::largest_free() const noexcept {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace tier::nvme
