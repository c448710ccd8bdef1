#include "policy/plan.hpp"

#include <algorithm>

namespace tier::policy {

PlanIndex::PlanIndex(std::vector<uint64_t> order, std::vector<uint8_t> overwrite)
    : order_(std::move(order)), overwrite_(std::move(overwrite)) {
  if (overwrite_.size() != order_.size()) overwrite_.clear();  // callers validate; never misindex
  for (uint32_t i = 0; i < order_.size(); ++i) positions_[order_[i]].push_back(i);
}

std::optional<uint64_t> PlanIndex::next_use(uint64_t id, uint64_t cursor) const {
  auto it = positions_.find(id);
  if (it == positions_.end() || order_.empty()) return std::nullopt;
  uint64_t c = cursor % order_.size();
  const std::vector<uint32_t>& pos = it->second;
  auto p = std::lower_bound(pos.begin(), pos.end(), c);
  if (p != pos.end()) return *p - c;
  return pos.front() + order_.size() - c;  // wraps into the next step
}

std::optional<uint64_t> PlanIndex::since_use(uint64_t id, uint64_t cursor) const {
  auto it = positions_.find(id);
  if (it == positions_.end() || order_.empty()) return std::nullopt;
  uint64_t c = cursor % order_.size();
  const std::vector<uint32_t>& pos = it->second;
  auto p = std::lower_bound(pos.begin(), pos.end(), c);
  if (p != pos.begin()) return c - *(p - 1);
  return c + order_.size() - pos.back();  // its last use was in the previous step
}

uint64_t PlanIndex::advance_cursor(uint64_t cursor, uint64_t id, size_t batch, bool& advanced) const {
  advanced = false;
  auto d = next_use(id, cursor);
  if (!d) return cursor;
  auto back = since_use(id, cursor);
  if (*d != 0 && back && *back <= batch) return cursor;  // a repeat
  advanced = true;
  return (cursor + *d + 1) % order_.size();
}

std::optional<uint64_t> PlanIndex::next_read(uint64_t id, uint64_t cursor) const {
  auto d = next_use(id, cursor);
  if (d && overwrites(cursor + *d)) return std::nullopt;
  return d;
}

}  // namespace tier::policy
