#include "policy/eviction.hpp"

#include <algorithm>
#include <cmath>

namespace tier::policy {

Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, const PlanIndex* plan,
                         uint64_t cursor) {
  const PlanAt one{plan, cursor};
  return make_candidate(id, bytes, last_use, std::span<const PlanAt>(&one, plan != nullptr ? 1 : 0));
}

bool timed_distances(std::span<const PlanAt> plans) {
  if (plans.size() < 2) return false;
  for (const PlanAt& p : plans)
    if (!(p.seconds_per_use > 0)) return false;
  return true;
}

uint64_t distance_key(const PlanAt& p, uint64_t uses, bool timed) {
  if (!timed) return uses;
  // Rounded up so that a use at distance >= 1 never compares equal to "now" (0).
  return static_cast<uint64_t>(std::ceil(static_cast<double>(uses) * p.seconds_per_use * 1e6));
}

Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, std::span<const PlanAt> plans) {
  Candidate c{id, bytes, last_use, std::nullopt};
  const bool timed = timed_distances(plans);
  // A tensor whose next use overwrites it is never read again as it is: like one in no plan.
  for (const PlanAt& p : plans) {
    c.planned = c.planned || p.plan->contains(id);
    auto n = p.plan->next_read(id, p.cursor);
    if (!n) continue;
    uint64_t k = distance_key(p, *n, timed);
    if (!c.next_use || k < *c.next_use) c.next_use = k;
  }
  return c;
}

namespace {
// A plan overwrites it before anyone reads it, and its RAM copy is clean: no I/O now or later.
bool free_to_drop(const Candidate& c) { return c.planned && !c.next_use && !c.dirty; }
// Dirty, overwritten next, and of a kind its client discards: the write-back would be wasted
// once the discard or the overwrite comes, which frees it for nothing.
bool held_for_discard(const Candidate& c) {
  return c.planned && !c.next_use && c.dirty && c.discarded_before;
}

// 0 free to drop, 1 in no plan or overwritten next (LRU), 2 read later by a plan (farthest
// first), 3 held for a discard.
int rank(const Candidate& c) {
  if (free_to_drop(c)) return 0;
  if (held_for_discard(c)) return 3;
  return c.next_use ? 2 : 1;
}

// Strict weak order: true when `a` should be evicted before `b`.
bool evict_before(const Candidate& a, const Candidate& b) {
  if (rank(a) != rank(b)) return rank(a) < rank(b);
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
