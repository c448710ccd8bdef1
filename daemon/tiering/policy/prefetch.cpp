#include "policy/prefetch.hpp"

#include <limits>
#include <unordered_set>

namespace tier::policy {

PrefetchPlan plan_prefetch(const PrefetchInput& in) {
  PrefetchPlan out;
  out.next_start = std::numeric_limits<double>::infinity();
  if (in.plan == nullptr || in.plan->empty() || in.bandwidth <= 0) return out;
  std::unordered_set<uint64_t> seen;
  const double base = in.cursor_at.value_or(in.now);
  // Starts within this of now count as due now (the backward pass accumulates rounding).
  const double eps = 1e-9;
  uint64_t len = in.plan->length();
  uint64_t missing = 0;
  for (uint64_t k = 0; k < len; ++k) {
    uint64_t id = in.plan->at(in.cursor + k);
    if (seen.contains(id)) {
      ++out.window_uses;
      continue;
    }
    uint64_t b = in.bytes_of ? in.bytes_of(id) : 0;
    if (out.window_bytes + b > in.budget_bytes) break;
    // A use that overwrites the tensor needs RAM there, not its bytes: counted, never fetched.
    bool present = in.plan->overwrites(in.cursor + k) || (in.present && in.present(id));
    if (!present && in.ahead_bytes != 0 && missing + b > in.ahead_bytes) break;
    seen.insert(id);
    out.window_bytes += b;
    ++out.window_uses;
    if (present) continue;
    missing += b;
    PrefetchItem it;
    it.id = id;
    it.bytes = b;
    it.distance = k;
    it.use_at = base + static_cast<double>(k) * in.seconds_per_use;
    out.items.push_back(it);
  }
  // Backwards: each fetch finishes by its use and before the next one must start.
  double latest = std::numeric_limits<double>::infinity();
  for (auto it = out.items.rbegin(); it != out.items.rend(); ++it) {
    double dur = static_cast<double>(it->bytes) / in.bandwidth * (1.0 + in.margin);
    it->finish_at = std::min(it->use_at, latest);
    it->start_at = it->finish_at - dur;
    it->late = it->start_at < in.now - eps;
    latest = it->start_at;
  }
  for (const PrefetchItem& it : out.items) {
    if (it.start_at <= in.now + eps) out.start_now.push_back(it.id);
    else out.next_start = std::min(out.next_start, it.start_at);
  }
  return out;
}

}  // namespace tier::policy
