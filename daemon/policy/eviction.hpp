// Eviction choice: which resident, unleased tensors to drop (or write back) to free bytes.
//
// Order of victims:
//  1. tensors in no plan (or whose next plan use overwrites them), least recently used first;
//  2. then planned tensors, the one whose next use is farthest away first (Belady's rule on
//     the known cyclic schedule), ties broken by LRU.
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
  uint64_t last_use = 0;               // LRU stamp: larger = used more recently
  std::optional<uint64_t> next_use;    // uses until its next plan use; nullopt = in no plan
};

// Builds a candidate, looking its next use up in `plan` (may be null: no plan).
Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, const PlanIndex* plan,
                         uint64_t cursor);

// A plan and where its cursor is.
struct PlanAt {
  const PlanIndex* plan = nullptr;
  uint64_t cursor = 0;
};
// The same over several plans of one pool (clients, or a client's streams, each with its own):
// the next use is the nearest read in any of them.
Candidate make_candidate(uint64_t id, uint64_t bytes, uint64_t last_use, std::span<const PlanAt> plans);

// Victims in eviction order, just enough that their bytes add up to at least `bytes_needed`
// (all candidates when they do not suffice; none when bytes_needed is 0).
std::vector<uint64_t> choose_victims(std::span<const Candidate> candidates, uint64_t bytes_needed);

// The whole eviction order (for callers that skip victims, e.g. ones being written back).
std::vector<uint64_t> eviction_order(std::span<const Candidate> candidates);

}  // namespace tier::policy
