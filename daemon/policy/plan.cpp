#include "policy/plan.hpp"

#include <algorithm>

namespace tier::policy {

PlanIndex::PlanIndex(std::vector<uint64_t> order) : order_(std::move(order)) {
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

}  // namespace tier::policy
