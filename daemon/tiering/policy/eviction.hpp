// Eviction choice: which resident, unleased tensors to drop (or write back) to free bytes.
//
// Order of victims:
//  1. tensors in no plan (or whose next plan use overwrites them), least recently used first,
//     except that clean tensors a plan overwrites next go before all of them: dropping those
//     costs nothing now or later, while a dirty one would be written back although no plan
//     reads those bytes again (left in RAM, it may be overwritten in place and never written);
//  2. then planned tensors, the one whose next use is farthest away first (Belady's rule on
//     the known cyclic schedule), ties broken by LRU;
//  3. last, dirty tensors a plan overwrites next whose client has discarded them before (a
//     double buffer between its last read and the commit that lets the client discard it):
//     their write-back would be wasted as soon as the discard (or the overwrite) comes, which
//     frees them for nothing, whereas a planned tensor's write-back is needed anyway when RAM
//     cannot hold it until its next read. A client that never discards keeps rule 1 for them.
// Unplanned tensors go first because a planned tensor is known to be needed again within one
// step, while an unplanned one has no known reuse: evicting it risks at most one miss on a
// tensor nobody announced, whereas evicting a planned tensor guarantees a miss (or a prefetch)
// within a step. With equal tensor sizes and demand fetching, rule 2 alone is optimal (fewest
// misses); tests check it against an exhaustive search. With unequal sizes it is the usual
// heuristic (the optimal choice is NP-hard).
//
// Pure logic: no I/O, no clocks, no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "policy/plan.hpp"

namespace tier::policy {

struct Candidate {
  uint64_t id = 0;
  uint64_t bytes = 0;
  uint64_t last_use = 0;  // LRU stamp: larger = used more recently
  // Distance to its next read in a plan: uses, or microseconds over several measured plans
  // (timed_distances); nullopt = in no plan, or overwritten before it is read.
  std::optional<uint64_t> next_use;
  bool planned = false;           // some plan uses it (set by make_candidate)
  bool dirty = false;             // leaving RAM needs a write-back first (set by the caller)
  bool discarded_before = false;  // its client has discarded it before (set by the caller)
};

// Builds a candidate, looking its next use up in `plan` (may be null: no plan).
Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, const PlanIndex* plan,
                         uint64_t cursor);

// A plan, where its cursor is, and how fast it advances (0: not measured yet).
struct PlanAt {
  const PlanIndex* plan = nullptr;
  uint64_t cursor = 0;
  double seconds_per_use = 0;
};
// The same over several plans of one pool (clients, or a client's streams, each with its own):
// the next use is the nearest read in any of them. Plans advance at their own rates (a
// trainer's pass leases a layer every tens of ms, its optimizer thread four tensors at once),
// so uses of different plans are not comparable: when every plan's rate is measured, distances
// are estimated times (see distance_key), otherwise uses.
Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, std::span<const PlanAt> plans);

// The unit of Candidate::next_use over `plans`: true when it is microseconds (several plans,
// each with a measured rate), false when it is uses.
bool timed_distances(std::span<const PlanAt> plans);
// `uses` of plan `p` in the unit timed_distances() chose (for a limit compared with next_use).
uint64_t distance_key(const PlanAt& p, uint64_t uses, bool timed);

// Victims in eviction order, just enough that their bytes add up to at least `bytes_needed`
// (all candidates when they do not suffice; none when bytes_needed is 0).
std::vector<uint64_t> choose_victims(std::span<const Candidate> candidates, uint64_t bytes_needed);

// The whole eviction order (for callers that skip victims, e.g. ones being written back).
std::vector<uint64_t> eviction_order(std::span<const Candidate> candidates);

}  // namespace tier::policy
