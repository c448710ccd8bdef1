#include "leases/lease_table.hpp"
#include "base/errors.hpp"

#include <algorithm>
#include <unordered_map>

namespace tier::daemon {

namespace {
constexpr uint32_t kNone = UINT32_MAX;
uint64_t make_id(uint32_t gen, uint32_t slot) { return (static_cast<uint64_t>(gen) << 32) | slot; }
}  // namespace

Status LeaseTable::check(LeaseMode mode, std::span<Tensor* const> tensors) const {
  for (const Tensor* t : tensors) {
    if (is_write(mode) && (t->writer || t->readers > 0))
      return Status(Code::kBusy,
                    "tensor '" + t->name + "' is leased (" +
                        (t->writer ? std::string("write") : std::to_string(t->readers) + " read") + ")");
    if (mode == LeaseMode::kRead && t->writer)
      return Status(Code::kBusy, "tensor '" + t->name + "' is write-leased");
  }
  if (is_write(mode) && tensors.size() > 1) {
    // A write batch naming a tensor twice could never be granted.
    const Tensor* dup = nullptr;
    if (tensors.size() <= 16) {
      for (size_t i = 1; i < tensors.size() && !dup; ++i)
        for (size_t j = 0; j < i; ++j)
          if (tensors[j] == tensors[i]) {
            dup = tensors[i];
            break;
          }
    } else {
      dup_scratch_.assign(tensors.begin(), tensors.end());
      std::sort(dup_scratch_.begin(), dup_scratch_.end());
      auto it = std::adjacent_find(dup_scratch_.begin(), dup_scratch_.end());
      if (it != dup_scratch_.end()) dup = *it;
    }
    if (dup)
      return Status(Code::kInvalidArgument, "tensor '" + dup->name + "' appears twice in one write lease");
  }
  return Status::ok();
}

bool LeaseTable::conflicts_only_with(LeaseMode mode, std::span<Tensor* const> tensors,
                                     const std::function<bool(uint64_t)>& gone) const {
  // Conflicts each tensor has, minus those explained by leases of gone sessions.
  std::unordered_map<uint64_t, uint64_t> unexplained;
  for (const Tensor* t : tensors) {
    uint64_t n = t->writer ? 1 : 0;
    if (is_write(mode)) n += t->readers;
    if (n > 0) unexplained[t->id] = n;
  }
  if (unexplained.empty()) return false;
  std::unordered_map<uint64_t, bool> asked;  // gone() once per session: it may cost a syscall
  for (const Slot& sl : slots_) {
    if (!sl.live) continue;
    auto it = unexplained.find(sl.lease.tensor_id);
    if (it == unexplained.end()) continue;
    if (mode == LeaseMode::kRead && sl.lease.mode == LeaseMode::kRead) continue;  // no conflict
    auto [known, fresh] = asked.try_emplace(sl.lease.session_id, false);
    if (fresh) known->second = gone(sl.lease.session_id);
    if (!known->second) return false;
    if (it->second > 0) it->second--;
  }
  for (const auto& [id, n] : unexplained)
    if (n > 0) return false;
  return true;
}

Status LeaseTable::acquire(SessionLeases& s, LeaseMode mode, std::span<Tensor* const> tensors,
                           Catalog& catalog, std::vector<uint64_t>& ids_out) {
  TIER_TRY(check(mode, tensors));
  for (Tensor* t : tensors) {
    uint32_t idx;
    if (free_head_ != kNone) {
      idx = free_head_;
      free_head_ = slots_[idx].next;
    } else {
      idx = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& sl = slots_[idx];
    sl.live = true;
    sl.gen++;
    sl.lease = Lease{t->id, t->pool_id, s.session_id, mode};
    link(s, idx);
    live_++;
    if (is_write(mode)) t->writer = true;
    else t->readers++;
    if (Pool* p = catalog.find_pool(t->pool_id)) p->leases++;
    ids_out.push_back(make_id(sl.gen, idx));
  }
  return Status::ok();
}

void LeaseTable::link(SessionLeases& s, uint32_t idx) {
  Slot& sl = slots_[idx];
  sl.prev = kNone;
  sl.next = s.head;
  if (s.head != kNone) slots_[s.head].prev = idx;
  s.head = idx;
  s.count++;
}

void LeaseTable::detach(SessionLeases& s, uint32_t idx) {
  Slot& sl = slots_[idx];
  if (sl.prev != kNone) slots_[sl.prev].next = sl.next;
  else s.head = sl.next;
  if (sl.next != kNone) slots_[sl.next].prev = sl.prev;
  s.count--;
}

Result<uint64_t> LeaseTable::transfer(SessionLeases& from, SessionLeases& to, uint64_t lease_id) {
  const Lease* l = find(lease_id);
  if (!l || l->session_id != from.session_id)
    return fail(Code::kNotFound, "no lease " + std::to_string(lease_id) + " to transfer");
  uint32_t idx = static_cast<uint32_t>(lease_id & 0xffffffffu);
  detach(from, idx);
  Slot& sl = slots_[idx];
  sl.gen++;
  sl.lease.session_id = to.session_id;
  link(to, idx);
  return make_id(sl.gen, idx);
}

void LeaseTable::unlink_slot(SessionLeases& s, uint32_t idx, Catalog& catalog) {
  Slot& sl = slots_[idx];
  detach(s, idx);
  live_--;
  if (on_write_end && is_write(sl.lease.mode)) on_write_end(sl.lease);
  if (Tensor* t = catalog.find_tensor(sl.lease.tensor_id)) {
    if (is_write(sl.lease.mode)) t->writer = false;
    else if (t->readers > 0) t->readers--;
  }
  if (Pool* p = catalog.find_pool(sl.lease.pool_id); p && p->leases > 0) p->leases--;
  sl.live = false;
  sl.prev = kNone;
  sl.next = free_head_;
  free_head_ = idx;
}

const LeaseTable::Lease* LeaseTable::find(uint64_t lease_id) const noexcept {
  uint32_t idx = static_cast<uint32_t>(lease_id & 0xffffffffu);
  uint32_t gen = static_cast<uint32_t>(lease_id >> 32);
  if (idx >= slots_.size()) return nullptr;
  const Slot& sl = slots_[idx];
  if (!sl.live || sl.gen != gen) return nullptr;
  return &sl.lease;
}

Status LeaseTable::release(SessionLeases& s, uint64_t lease_id, Catalog& catalog) {
  const Lease* l = find(lease_id);
  if (!l || l->session_id != s.session_id)
    return Status(Code::kNotFound, "no lease " + std::to_string(lease_id) + " held by this client");
  unlink_slot(s, static_cast<uint32_t>(lease_id & 0xffffffffu), catalog);
  return Status::ok();
}

size_t LeaseTable::release_all(SessionLeases& s, Catalog& catalog) {
  size_t n = 0;
  while (s.head != kNone) {
    unlink_slot(s, s.head, catalog);
    ++n;
  }
  return n;
}

void LeaseTable::drop_waiters(uint64_t session_id) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->session_id == session_id) it = waiters_.erase(it);
    else ++it;
  }
}

std::optional<Clock::time_point> LeaseTable::next_deadline() const noexcept {
  std::optional<Clock::time_point> d;
  for (const auto& w : waiters_)
    if (w.deadline != Clock::time_point::max() && (!d || w.deadline < *d)) d = w.deadline;
  return d;
}

}  // namespace tier::daemon
