// Watermarks of a node's RAM tier: above `high` (a fraction of capacity), evict unleased
// tensors until usage is back at `low`. The gap keeps eviction in batches instead of one tensor
// per allocation. Pure arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tier::policy {

struct Watermarks {
  double high = 0.90;
  double low = 0.80;
  // Clamps to 0 <= low <= high <= 1.
  Watermarks normalized() const {
    double h = std::clamp(high, 0.0, 1.0);
    return {h, std::clamp(low, 0.0, h)};
  }
};

// Bytes to evict now: 0 at or below the high watermark, else enough to reach the low one.
inline uint64_t bytes_to_evict(uint64_t used, uint64_t capacity, Watermarks w) {
  w = w.normalized();
  auto high = static_cast<uint64_t>(static_cast<double>(capacity) * w.high);
  auto low = static_cast<uint64_t>(static_cast<double>(capacity) * w.low);
  return used > high ? used - low : 0;
}

// Bytes to evict before admitting `incoming` more bytes: at least what makes it fit at all,
// and, when admitting it crosses the high watermark, down to the low watermark.
inline uint64_t bytes_to_admit(uint64_t used, uint64_t incoming, uint64_t capacity, Watermarks w) {
  uint64_t after = used + incoming;
  uint64_t must = after > capacity ? after - capacity : 0;
  return std::max(must, bytes_to_evict(after, capacity, w));
}

}  // namespace tier::policy
