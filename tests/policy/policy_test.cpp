// Tiering policy: Belady on the cyclic plan against an exhaustive optimum, LRU fallback,
// prefetch timing, watermarks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "policy/eviction.hpp"
#include "policy/plan.hpp"
#include "policy/prefetch.hpp"
#include "policy/watermark.hpp"

using namespace tier::policy;

namespace {

// Fewest misses any eviction sequence achieves on `trace` with room for k equal-sized tensors
// (demand fetching: on a miss with a full cache exactly one resident tensor is dropped).
int brute_force_min_misses(const std::vector<uint64_t>& trace, int k) {
  std::map<std::pair<size_t, uint32_t>, int> memo;
  auto go = [&](auto&& self, size_t t, uint32_t cache) -> int {
    if (t == trace.size()) return 0;
    auto key = std::make_pair(t, cache);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    uint32_t bit = 1u << trace[t];
    int best;
    if (cache & bit) {
      best = self(self, t + 1, cache);
    } else if (__builtin_popcount(cache) < k) {
      best = 1 + self(self, t + 1, cache | bit);
    } else {
      best = std::numeric_limits<int>::max();
      for (uint32_t c = cache; c; c &= c - 1) {
        uint32_t victim = c & -c;
        best = std::min(best, 1 + self(self, t + 1, (cache & ~victim) | bit));
      }
    }
    memo[key] = best;
    return best;
  };
  return go(go, 0, 0);
}

// Misses of the policy under test: victims from choose_victims (with the plan when given).
int simulate(const PlanIndex& plan, size_t cycles, int k, bool use_plan) {
  std::set<uint64_t> cache;
  std::unordered_map<uint64_t, uint64_t> last_use;
  int misses = 0;
  uint64_t clock = 0;
  for (size_t t = 0; t < cycles * plan.length(); ++t) {
    uint64_t x = plan.at(t);
    if (!cache.contains(x)) {
      ++misses;
      if (static_cast<int>(cache.size()) >= k) {
        std::vector<Candidate> cands;
        for (uint64_t y : cache)
          cands.push_back(make_candidate(y, 1, last_use[y], use_plan ? &plan : nullptr, t + 1));
        auto v = choose_victims(cands, 1);
        REQUIRE(v.size() == 1);
        cache.erase(v[0]);
      }
      cache.insert(x);
    }
    last_use[x] = ++clock;
  }
  return misses;
}

}  // namespace

TEST_CASE("plan index: next use counts cyclically and handles repeats") {
  PlanIndex p({10, 11, 12, 11, 13});
  CHECK(p.next_use(10, 0) == 0u);
  CHECK(p.next_use(10, 1) == 4u);  // wraps into the next step
  CHECK(p.next_use(11, 2) == 1u);  // second use within the step
  CHECK(p.next_use(11, 4) == 2u);
  CHECK(p.next_use(13, 7) == 2u);  // cursor beyond one step is taken modulo the length
  CHECK_FALSE(p.next_use(99, 0).has_value());
}

TEST_CASE("eviction: Belady on the cyclic plan matches the exhaustive optimum") {
  std::mt19937_64 g(2024);
  int cases = 0, lru_worse = 0;
  for (int c = 0; c < 400; ++c) {
    int m = 2 + static_cast<int>(g() % 6);        // distinct tensors
    int n = m + static_cast<int>(g() % 5);        // plan length (repeats allowed)
    int k = 1 + static_cast<int>(g() % (m - 1));  // room for k tensors
    size_t cycles = 1 + g() % 3;
    std::vector<uint64_t> order;
    for (int i = 0; i < m; ++i) order.push_back(i);
    for (int i = m; i < n; ++i) order.push_back(g() % m);
    std::shuffle(order.begin(), order.end(), g);
    PlanIndex plan(order);
    std::vector<uint64_t> trace;
    for (size_t t = 0; t < cycles * order.size(); ++t) trace.push_back(plan.at(t));
    int opt = brute_force_min_misses(trace, k);
    int belady = simulate(plan, cycles, k, true);
    int lru = simulate(plan, cycles, k, false);
    INFO("plan size " << n << " tensors " << m << " room " << k << " cycles " << cycles);
    REQUIRE(belady == opt);
    REQUIRE(lru >= opt);
    lru_worse += lru > opt;
    ++cases;
  }
  CHECK(cases == 400);
  CHECK(lru_worse > 0);  // the cases are not all trivial
}

TEST_CASE("eviction: a cyclic plan over twice the room defeats LRU but not the plan") {
  std::vector<uint64_t> order;
  for (uint64_t i = 0; i < 16; ++i) order.push_back(i);
  PlanIndex plan(order);
  int lru = simulate(plan, 4, 8, false);
  int belady = simulate(plan, 4, 8, true);
  CHECK(lru == 64);                // every access misses
  CHECK(belady < 16 + 3 * 9 + 1);  // cold misses, then about n - k + 1 per step
}

TEST_CASE("eviction: tensors in no plan go first, least recently used first") {
  PlanIndex plan({1, 2, 3});
  std::vector<Candidate> c = {
      make_candidate(1, 100, 50, &plan, 1),  // planned, next use in 2
      make_candidate(2, 100, 10, &plan, 1),  // planned, next use now (0)
      make_candidate(7, 100, 30, &plan, 1),  // unplanned, used at 30
      make_candidate(8, 100, 20, &plan, 1),  // unplanned, used at 20
      make_candidate(3, 100, 40, &plan, 1),  // planned, next use in 1
  };
  CHECK(eviction_order(c) == std::vector<uint64_t>{8, 7, 1, 3, 2});
  CHECK(choose_victims(c, 150) == std::vector<uint64_t>{8, 7});
  CHECK(choose_victims(c, 0).empty());
  CHECK(choose_victims(c, 10000).size() == 5);
  // No plan at all: plain LRU.
  std::vector<Candidate> lru = {make_candidate(5, 1, 3, nullptr, 0), make_candidate(6, 1, 1, nullptr, 0),
                                make_candidate(4, 1, 2, nullptr, 0)};
  CHECK(eviction_order(lru) == std::vector<uint64_t>{6, 4, 5});
}

TEST_CASE("eviction: a clean tensor a plan overwrites next goes first; a dirty one keeps LRU order") {
  // Uses: 1 read, 2 overwritten, 3 overwritten, 4 read. Cursor at 0.
  PlanIndex plan({1, 2, 3, 4}, {0, 1, 1, 0});
  auto cand = [&](uint64_t id, uint64_t last_use, bool dirty) {
    Candidate c = make_candidate(id, 100, last_use, &plan, 0);
    c.dirty = dirty;
    return c;
  };
  std::vector<Candidate> c = {
      cand(2, 5, true),    // overwritten next, dirty: a write-back of dead bytes
      cand(3, 40, false),  // overwritten next, clean: free
      cand(9, 10, false),  // in no plan, clean
      cand(8, 1, true),    // in no plan, dirty, least recently used
      cand(4, 2, false),   // read at 3
  };
  CHECK(c[1].planned);
  CHECK_FALSE(c[2].planned);
  CHECK(eviction_order(c) == std::vector<uint64_t>{3, 8, 2, 9, 4});
  CHECK(choose_victims(c, 100) == std::vector<uint64_t>{3});
  // Unplanned tensors keep plain LRU whatever their state: a hot clean tensor never goes
  // before a cold dirty one just because it is cheaper to drop.
  std::vector<Candidate> lru = {cand(9, 10, false), cand(8, 1, true)};
  CHECK(eviction_order(lru) == std::vector<uint64_t>{8, 9});
}

TEST_CASE("eviction: a dirty tensor overwritten next that its client discards goes last") {
  // Uses: 1 read, 2 overwritten, 3 overwritten, 4 read, 5 read. Cursor at 0.
  PlanIndex plan({1, 2, 3, 4, 5}, {0, 1, 1, 0, 0});
  auto cand = [&](uint64_t id, uint64_t last_use, bool dirty, bool discarded_before) {
    Candidate c = make_candidate(id, 100, last_use, &plan, 0);
    c.dirty = dirty;
    c.discarded_before = discarded_before;
    return c;
  };
  std::vector<Candidate> c = {
      cand(2, 1, true, true),    // a double buffer between its last read and its discard
      cand(3, 40, true, false),  // overwritten next, dirty, never discarded: rule 1 (LRU)
      cand(4, 2, true, true),    // read at 3: planned, farthest-first among those read
      cand(5, 3, false, true),   // read at 4
      cand(9, 10, false, true),  // in no plan
  };
  CHECK(eviction_order(c) == std::vector<uint64_t>{9, 3, 5, 4, 2});
  CHECK(choose_victims(c, 300) == std::vector<uint64_t>{9, 3, 5});
  // Clean, it is free to drop whatever its history.
  c[0].dirty = false;
  CHECK(eviction_order(c).front() == 2);
}

TEST_CASE("prefetch: each fetch is timed to finish just before its use") {
  PlanIndex plan({1, 2, 3, 4, 5, 6});
  PrefetchInput in;
  in.plan = &plan;
  in.cursor = 0;
  in.present = [](uint64_t id) { return id == 1; };
  in.bytes_of = [](uint64_t) { return uint64_t{100'000'000}; };
  in.budget_bytes = 1'000'000'000;
  in.bandwidth = 1e9;        // 0.1 s per tensor
  in.seconds_per_use = 0.5;  // device keeps up easily
  in.margin = 0;
  in.now = 10;
  auto p = plan_prefetch(in);
  REQUIRE(p.items.size() == 5);  // 2..6; 1 is resident
  for (const PrefetchItem& it : p.items) {
    CHECK(it.finish_at == Approx(it.use_at));       // arrives just in time...
    CHECK(it.start_at == Approx(it.use_at - 0.1));  // ...and is not started earlier
    CHECK_FALSE(it.late);
  }
  CHECK(p.start_now.empty());
  CHECK(p.next_start == Approx(10.4));  // tensor 2, used at 10.5
  in.cursor_at = 10;  // later, with the cursor still at 0 (its use due at 10): tensor 2 is due
  in.now = 10.45;
  auto q = plan_prefetch(in);
  CHECK(q.start_now == std::vector<uint64_t>{2});
}

TEST_CASE("prefetch: a device slower than the plan starts fetches earlier, back to back") {
  PlanIndex plan({1, 2, 3, 4});
  PrefetchInput in;
  in.plan = &plan;
  in.present = [](uint64_t) { return false; };
  in.bytes_of = [](uint64_t) { return uint64_t{300}; };
  in.budget_bytes = 10'000;
  in.bandwidth = 1000;       // 0.3 s per tensor
  in.seconds_per_use = 0.1;  // uses every 0.1 s
  in.margin = 0;
  in.now = 0;
  auto p = plan_prefetch(in);
  REQUIRE(p.items.size() == 4);
  for (size_t i = 0; i < p.items.size(); ++i) {
    const PrefetchItem& it = p.items[i];
    CHECK(it.finish_at <= it.use_at + 1e-9);
    if (i + 1 < p.items.size()) CHECK(it.finish_at == Approx(p.items[i + 1].start_at));
  }
  CHECK(p.items.back().finish_at == Approx(0.3));
  CHECK(p.items.front().start_at == Approx(-0.9));
  CHECK(p.items.front().late);
  // everything that should already have started is to be issued now, in use order
  CHECK(p.start_now == std::vector<uint64_t>{1, 2, 3, 4});
}

TEST_CASE("prefetch: the window stops at the residency budget and skips repeats") {
  PlanIndex plan({1, 2, 1, 3, 4, 5});
  PrefetchInput in;
  in.plan = &plan;
  in.cursor = 1;
  in.present = [](uint64_t id) { return id == 2; };
  in.bytes_of = [](uint64_t) { return uint64_t{100}; };
  in.budget_bytes = 350;  // room for 3 distinct tensors: 2, 1, 3
  in.bandwidth = 1e6;
  in.seconds_per_use = 1;
  auto p = plan_prefetch(in);
  CHECK(p.window_bytes == 300);
  CHECK(p.window_uses == 3);  // 2, 1, 3; 4 did not fit
  REQUIRE(p.items.size() == 2);
  CHECK(p.items[0].id == 1);
  CHECK(p.items[0].distance == 1);
  CHECK(p.items[1].id == 3);
  CHECK(p.items[1].distance == 2);
}

TEST_CASE("plan overwrites: nothing is fetched for them and their tensors are victims first") {
  // Uses: 1 read, 2 overwritten, 3 read, 2 read, 4 overwritten.
  PlanIndex plan({1, 2, 3, 2, 4}, {0, 1, 0, 0, 1});
  CHECK(plan.overwrites(1));
  CHECK_FALSE(plan.overwrites(3));
  CHECK(plan.overwrites(1 + 5));  // cyclic
  CHECK(plan.next_use(2, 0) == 1u);
  CHECK_FALSE(plan.next_read(2, 0).has_value());  // overwritten before it is read
  CHECK(plan.next_read(2, 2) == 1u);              // after the overwrite, the read at 3 counts
  CHECK_FALSE(plan.next_read(4, 0).has_value());
  CHECK(plan.next_read(1, 2) == 3u);

  PrefetchInput in;
  in.plan = &plan;
  in.cursor = 0;
  in.present = [](uint64_t) { return false; };
  in.bytes_of = [](uint64_t) { return uint64_t{100}; };
  in.budget_bytes = 10000;
  in.bandwidth = 1e6;
  in.seconds_per_use = 1;
  auto p = plan_prefetch(in);
  std::vector<uint64_t> fetched;
  for (const auto& it : p.items) fetched.push_back(it.id);
  CHECK(fetched == std::vector<uint64_t>{1, 3});  // 2 and 4 are overwritten before any read
  CHECK(p.window_bytes == 400);                   // but their RAM is counted in the window

  // Belady sees "overwritten next" as never read again: such a tensor goes before one read soon.
  std::vector<Candidate> cands{make_candidate(3, 100, 5, &plan, 0), make_candidate(2, 100, 9, &plan, 0)};
  CHECK(eviction_order(cands).front() == 2);
  // Without flags the same order keeps 2 (used at distance 1) over 3 (distance 2).
  PlanIndex plain({1, 2, 3, 2, 4});
  std::vector<Candidate> plain_cands{make_candidate(3, 100, 5, &plain, 0),
                                     make_candidate(2, 100, 9, &plain, 0)};
  CHECK(eviction_order(plain_cands).front() == 3);
  // Over several plans of a pool the nearest read counts: 3 is read next in `other`.
  PlanIndex other({3, 1});
  const PlanAt both[] = {{&plan, 0}, {&other, 0}};
  CHECK(make_candidate(3, 100, 5, both).next_use == 0u);
  CHECK_FALSE(
      make_candidate(4, 100, 5, both).next_use.has_value());  // overwritten in one, absent in the other
  CHECK(make_candidate(1, 100, 5, both).next_use == 0u);
  // Plans advancing at different rates: compared in estimated time once every rate is known.
  // `slow` reads 3 in 2 uses of 0.5 s (1 s away); `fast` reads 1 in 4 uses of 10 ms (40 ms).
  PlanIndex slow({5, 6, 3}), fast({7, 8, 9, 6, 1});
  const PlanAt unmeasured[] = {{&slow, 0, 0.5}, {&fast, 0, 0}};
  CHECK_FALSE(timed_distances(unmeasured));
  CHECK(make_candidate(3, 100, 5, unmeasured).next_use == 2u);  // uses
  CHECK(make_candidate(1, 100, 5, unmeasured).next_use == 4u);
  const PlanAt rated[] = {{&slow, 0, 0.5}, {&fast, 0, 0.01}};
  REQUIRE(timed_distances(rated));
  CHECK(make_candidate(3, 100, 5, rated).next_use == 1000000u);  // microseconds
  CHECK(make_candidate(1, 100, 5, rated).next_use == 40000u);
  CHECK(make_candidate(6, 100, 5, rated).next_use == 30000u);  // nearest over both: fast's
  std::vector<Candidate> mixed{make_candidate(3, 100, 5, rated), make_candidate(1, 100, 5, rated)};
  CHECK(eviction_order(mixed).front() == 3);  // counted in uses, 1 (4 uses) would have gone first
  CHECK(distance_key(rated[1], 4, true) == 40000u);
  CHECK(distance_key(rated[1], 4, false) == 4u);
  const PlanAt one[] = {{&slow, 0, 0.5}};
  CHECK_FALSE(timed_distances(one));  // a single plan keeps its uses
  // Flags of the wrong length are ignored rather than misread.
  PlanIndex bad({1, 2}, {1});
  CHECK_FALSE(bad.overwrites(0));
}

TEST_CASE("plan cursor: a lease advances it past its use; a repeated lease leaves it") {
  // One step: 10 20 30 40 | 50 60 (ids); the second part is leased as one batch.
  PlanIndex plan({10, 20, 30, 40, 50, 60});
  bool moved = false;
  uint64_t c = 0;
  c = plan.advance_cursor(c, 10, 1, moved);
  CHECK((c == 1 && moved));
  c = plan.advance_cursor(c, 20, 1, moved);
  CHECK((c == 2 && moved));
  // The client's wait slice expired and it asks for 20 again: not the next step's use.
  c = plan.advance_cursor(c, 20, 1, moved);
  CHECK((c == 2 && !moved));
  c = plan.advance_cursor(c, 30, 1, moved);
  CHECK(c == 3);
  // A tensor ahead of the cursor (uses skipped) still advances to just past it.
  c = plan.advance_cursor(c, 50, 1, moved);
  CHECK((c == 5 && moved));
  c = plan.advance_cursor(c, 60, 1, moved);
  CHECK(c == 0);  // wrapped: the next step starts
  // A batch of 2 asked again after it was granted: every tensor of it is a repeat.
  c = 4;
  c = plan.advance_cursor(c, 50, 2, moved);
  c = plan.advance_cursor(c, 60, 2, moved);
  CHECK(c == 0);
  c = plan.advance_cursor(c, 50, 2, moved);
  CHECK((c == 0 && !moved));
  c = plan.advance_cursor(c, 60, 2, moved);
  CHECK((c == 0 && !moved));
  // The next step's first use moves on as usual.
  c = plan.advance_cursor(c, 10, 1, moved);
  CHECK((c == 1 && moved));
  // A tensor used twice per step (forward and backward): a repeated lease of its forward use
  // must not move the cursor to its backward use, past everything in between.
  PlanIndex fwd_bwd({10, 20, 30, 20, 40});
  c = fwd_bwd.advance_cursor(1, 20, 1, moved);
  CHECK(c == 2);
  c = fwd_bwd.advance_cursor(c, 20, 1, moved);
  CHECK((c == 2 && !moved));
  c = fwd_bwd.advance_cursor(c, 30, 1, moved);
  c = fwd_bwd.advance_cursor(c, 20, 1, moved);  // the backward use, at the cursor
  CHECK((c == 4 && moved));
  // A tensor used twice in a row is at the cursor the second time: that advances.
  PlanIndex twice({1, 1, 2});
  c = twice.advance_cursor(0, 1, 1, moved);
  c = twice.advance_cursor(c, 1, 1, moved);
  CHECK((c == 2 && moved));
  CHECK(plan.since_use(20, 2) == 1u);
  CHECK(plan.since_use(60, 1) == 2u);  // last used in the previous step
  CHECK_FALSE(plan.since_use(99, 0).has_value());
}

TEST_CASE("watermarks: evict only above high, then down to low") {
  Watermarks w{0.9, 0.7};
  CHECK(bytes_to_evict(900, 1000, w) == 0);
  CHECK(bytes_to_evict(901, 1000, w) == 201);
  CHECK(bytes_to_evict(1000, 1000, w) == 300);
  CHECK(bytes_to_admit(500, 100, 1000, w) == 0);
  CHECK(bytes_to_admit(850, 100, 1000, w) == 250);
  CHECK(bytes_to_admit(950, 200, 1000, w) == 450);
  Watermarks odd{0.5, 0.8};  // low above high is clamped to high
  CHECK(bytes_to_evict(600, 1000, odd) == 100);
}
