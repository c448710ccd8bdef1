// The leases a Client holds, so that it can re-acquire them after tierd restarts.
//
// Keyed by what the caller's Lease object carries: (connection epoch at grant, lease id as
// granted). The value is the lease id the daemon knows now (a re-acquired lease gets a new one)
// and what is needed to re-acquire it. Open addressing with linear probing and backward-shift
// deletion over a power-of-two vector: insert, find and erase touch no heap once the table has
// grown to the working set (the lease hot path must not allocate). Thread-safety: none; the
// Client's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tier::client {

struct HeldLease {
  uint64_t id = 0;     // key: the id the Lease object carries
  uint32_t epoch = 0;  // key: the connection epoch it was granted in
  bool used = false;
  uint8_t mode = 0;  // tier::LeaseMode
  uint64_t tensor_id = 0;
  uint64_t daemon_id = 0;             // the id to release with (differs after a re-acquire)
  uint64_t arena_id = 0, offset = 0;  // where its bytes are: a re-acquire must land there
};

class HeldLeases {
 public:
  void insert(const HeldLease& h) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    size_t i = slot(h.id, h.epoch);
    while (slots_[i].used) i = (i + 1) & mask();
    slots_[i] = h;
    slots_[i].used = true;
    ++count_;
  }
  HeldLease* find(uint64_t id, uint32_t epoch) noexcept {
    if (slots_.empty()) return nullptr;
    for (size_t i = slot(id, epoch);; i = (i + 1) & mask()) {
      if (!slots_[i].used) return nullptr;
      if (slots_[i].id == id && slots_[i].epoch == epoch) return &slots_[i];
    }
  }
  void erase(HeldLease* h) noexcept {
    size_t i = static_cast<size_t>(h - slots_.data());
    slots_[i].used = false;
    --count_;
    // Backward shift: pull later entries of the probe chain into the hole.
    for (size_t j = (i + 1) & mask(); slots_[j].used; j = (j + 1) & mask()) {
      size_t home = slot(slots_[j].id, slots_[j].epoch);
      bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
      if (movable) {
        slots_[i] = slots_[j];
        slots_[j].used = false;
        i = j;
      }
    }
  }
  size_t size() const noexcept { return count_; }
  // Every held lease, in table order (pointers stay valid until the next insert).
  template <class F> void for_each(F&& f) {
    for (HeldLease& h : slots_)
      if (h.used) f(h);
  }

 private:
  size_t mask() const noexcept { return slots_.size() - 1; }
  size_t slot(uint64_t id, uint32_t epoch) const noexcept {
    uint64_t x = (id ^ (uint64_t{epoch} << 40)) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(x >> 32) & mask();
  }
  void grow() {
    std::vector<HeldLease> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 64 : old.size() * 2, HeldLease{});
    count_ = 0;
    for (const HeldLease& h : old)
      if (h.used) insert(h);
  }
  std::vector<HeldLease> slots_;
  size_t count_ = 0;
};

}  // namespace tier::client
