// PlanIndex: a registered plan (the ordered tensor uses of one training step, repeating every
// step) indexed for "when is this tensor next used?".
//
// Positions: the cursor is the index in [0, length) of the next expected use; the daemon
// advances it as the plan's leases arrive. A tensor may appear several times in one step
// (forward and backward). A use may be marked "overwrite": the client writes every byte of the
// tensor there without reading it, so its bytes are dead between the previous use and that one
// (no prefetch for it, and the cheapest of victims). Immutable after construction; safe to share
// between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tier::policy {

class PlanIndex {
 public:
  PlanIndex() = default;
  // `overwrite` is empty (no use overwrites) or has one flag per use of `order`.
  explicit PlanIndex(std::vector<uint64_t> order, std::vector<uint8_t> overwrite = {});

  size_t length() const noexcept { return order_.size(); }
  bool empty() const noexcept { return order_.empty(); }
  uint64_t at(uint64_t pos) const { return order_.at(pos % order_.size()); }
  bool contains(uint64_t id) const { return positions_.contains(id); }
  // Uses between `cursor` and the next use of `id`, counting cyclically: 0 when `id` is the use
  // at `cursor`, length()-1 at most; nullopt when the plan does not use `id`.
  std::optional<uint64_t> next_use(uint64_t id, uint64_t cursor) const;
  // Uses between the most recent use of `id` before `cursor` and `cursor`, counting cyclically:
  // 1 when `id` is the use just before `cursor`; nullopt when the plan does not use `id`.
  std::optional<uint64_t> since_use(uint64_t id, uint64_t cursor) const;
  // Where the cursor goes when a lease of `batch` tensors names `id`: just past its next use,
  // unless the lease repeats uses the cursor has just passed (a client retrying after a wait
  // slice expired, or a batch asked again: `id` not at the cursor but used within the last
  // `batch` uses), which leaves it where it is. Advancing for a repeat would push the cursor a
  // whole step ahead, and eviction and prefetch would then treat the tensors needed now as
  // the farthest. `advanced` says whether it moved.
  uint64_t advance_cursor(uint64_t cursor, uint64_t id, size_t batch, bool& advanced) const;
  // Whether the use at `pos` (cyclic) overwrites its tensor.
  bool overwrites(uint64_t pos) const {
    return !overwrite_.empty() && overwrite_[pos % overwrite_.size()] != 0;
  }
  // next_use(), but nullopt also when that next use overwrites the tensor: its present bytes
  // are never read again.
  std::optional<uint64_t> next_read(uint64_t id, uint64_t cursor) const;
  const std::vector<uint64_t>& order() const noexcept { return order_; }

 private:
  std::vector<uint64_t> order_;
  std::vector<uint8_t> overwrite_;                                 // empty or order_.size() flags
  std::unordered_map<uint64_t, std::vector<uint32_t>> positions_;  // ascending positions
};

}  // namespace tier::policy
