#include "ram/extent_allocator.hpp"

#include <algorithm>
#include <iterator>

namespace tier::daemon {

ExtentAllocator::ExtentAllocator(uint64_t capacity) : capacity_(capacity & ~(kGranule - 1)) {
  if (capacity_ > 0) insert_free(0, capacity_);
}

void ExtentAllocator::insert_free(uint64_t off, uint64_t size) {
  by_offset_.emplace(off, size);
  by_size_.emplace(size, off);
}

void ExtentAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

std::optional<uint64_t> ExtentAllocator::allocate(uint64_t size, uint64_t align) {
  if (size == 0 || align < kGranule || (align & (align - 1)) != 0) return std::nullopt;
  if (size > capacity_) return std::nullopt;
  size = round_up(size, kGranule);
  // Best fit: the smallest free ranges of at least `size`; the first few are checked for an
  // aligned fit, after which the smallest range of size + align - granule (which always
  // fits) is taken. This bounds the work while staying best-fit for aligned ranges.
  auto fits = [&](uint64_t off, uint64_t len) {
    uint64_t start = round_up(off, align);
    return start - off <= len && len - (start - off) >= size;
  };
  std::optional<std::pair<uint64_t, uint64_t>> pick;
  constexpr int kProbe = 8;
  int probed = 0;
  for (auto it = by_size_.lower_bound({size, 0}); it != by_size_.end() && probed < kProbe; ++it, ++probed) {
    if (fits(it->second, it->first)) {
      pick = std::make_pair(it->second, it->first);
      break;
    }
  }
  if (!pick && align > kGranule) {
    auto it = by_size_.lower_bound({size + align - kGranule, 0});
    if (it != by_size_.end()) pick = std::make_pair(it->second, it->first);
  }
  if (!pick) return std::nullopt;
  auto [off, len] = *pick;
  uint64_t start = round_up(off, align);
  erase_free(by_offset_.find(off));
  if (start > off) insert_free(off, start - off);
  uint64_t end = start + size;
  if (off + len > end) insert_free(end, off + len - end);
  used_ += size;
  return start;
}

bool ExtentAllocator::free(uint64_t offset, uint64_t size) {
  size = round_up(size, kGranule);
  if (size == 0 || offset % kGranule != 0 || offset > capacity_ || size > capacity_ - offset) return false;
  // The range must not overlap any free range.
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first < offset + size) return false;
  auto prev = next == by_offset_.begin() ? by_offset_.end() : std::prev(next);
  if (prev != by_offset_.end() && prev->first + prev->second > offset) return false;
  uint64_t start = offset, len = size;
  if (prev != by_offset_.end() && prev->first + prev->second == offset) {
    start = prev->first;
    len += prev->second;
    erase_free(prev);
  }
  if (next != by_offset_.end() && next->first == offset + size) {
    len += next->second;
    erase_free(next);
  }
  insert_free(start, len);
  used_ -= size;
  return true;
}

std::vector<std::pair<uint64_t, uint64_t>> ExtentAllocator::free_within(uint64_t begin, uint64_t end) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  auto it = by_offset_.upper_bound(begin);
  if (it != by_offset_.begin()) --it;
  for (; it != by_offset_.end() && it->first < end; ++it) {
    const uint64_t b = std::max(it->first, begin), e = std::min(it->first + it->second, end);
    if (b < e) out.emplace_back(b, e - b);
  }
  return out;
}

bool ExtentAllocator::reserve(uint64_t offset, uint64_t size) {
  size = round_up(size, kGranule);
  if (size == 0 || offset % kGranule != 0 || offset > capacity_ || size > capacity_ - offset) return false;
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  uint64_t off = it->first, len = it->second;
  if (off + len < offset + size) return false;
  erase_free(it);
  if (offset > off) insert_free(off, offset - off);
  if (off + len > offset + size) insert_free(offset + size, off + len - offset - size);
  used_ += size;
  return true;
}

uint64_t ExtentAllocator::largest_free() const noexcept {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

double ExtentAllocator::fragmentation() const noexcept {
  uint64_t f = free_bytes();
  if (f == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free()) / static_cast<double>(f);
}

}  // namespace tier::daemon
