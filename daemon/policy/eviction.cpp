#include "policy/eviction.hpp"

#include <algorithm>

namespace tier::policy {

Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, const PlanIndex* plan,
                         uint64_t cursor) {
  const PlanAt one{plan, cursor};
  return make_candidate(id, bytes, last_use, std::span<const PlanAt>(&one, plan != nullptr ? 1 : 0));
}

Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, std::span<const PlanAt> plans) {
  Candidate c{id, bytes, last_use, std::nullopt};
  // A tensor whose next use overwrites it is never read again as it is: like one in no plan.
  for (const PlanAt& p : plans) {
    auto n = p.plan->next_read(id, p.cursor);
    if (n && (!c.next_use || *n < *c.next_use)) c.next_use = n;
  }
  return c;
}

namespace {
// Strict weak order: true when `a` should be evicted before `b`.
bool evict_before(const Candidate& a, const Candidate& b) {
  if (a.next_use.has_value() != b.next_use.has_value()) return !a.next_use.has_value();
  if (a.next_use && *a.next_use != *b.next_use) return *a.next_use > *b.next_use;
  if (a.last_use != b.last_use) return a.last_use < b.last_use;
  return a.id < b.id;
}
}  // namespace

std::vector<uint64_t> eviction_order(std::span<const Candidate> candidates) {
  std::vector<const Candidate*> v;
  v.reserve(candidates.size());
  for (const Candidate& c : candidates) v.push_back(&c);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return evict_before(*a, *b); });
  std::vector<uint64_t> out;
  out.reserve(v.size());
  for (auto* c : v) out.push_back(c->id);
  return out;
}

std::vector<uint64_t> choose_victims(std::span<const Candidate> candidates, uint64_t bytes_needed) {
  std::vector<uint64_t> out;
  if (bytes_needed == 0) return out;
  std::vector<const Candidate*> v;
  v.reserve(candidates.size());
  for (const Candidate& c : candidates) v.push_back(&c);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return evict_before(*a, *b); });
  uint64_t freed = 0;
  for (auto* c : v) {
    if (freed >= bytes_needed) break;
    out.push_back(c->id);
    freed += c->bytes;
  }
  return out;
}

}  // namespace tier::policy
