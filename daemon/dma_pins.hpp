// Arena ranges that clients have pinned for DMA (cudaHostRegister, told with an ArenaPin
// request). A device reads and writes the physical pages that were pinned, not whatever the
// arena holds at that offset later: if tierd punched such a range out of the arena on
// eviction, the arena would get fresh pages on the next fetch while the device kept using the
// old ones, and an H2D after evict + refetch would copy stale bytes. So NvmeTier punches
// only the parts of a freed extent that no pin covers (unpinned()); pinned pages stay the
// arena's, resident, and are reused in place.
//
// A pin belongs to one session (connection) and goes with it (drop_session), since a process's
// registrations end when it does. Ranges are widened to whole 4 KiB pages. The same range may
// be pinned several times (several stagers in one process); each pin is removed separately.
// Thread-safety: none; the daemon's loop thread owns it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tier/status.hpp"

namespace tier::daemon {

class DmaPins {
 public:
  static constexpr uint64_t kPage = 4096;
  static constexpr size_t kMaxPinsPerSession = 4096;

  // kResourceExhausted past kMaxPinsPerSession pins of one session; kInvalidArgument for an
  // empty or overflowing range.
  [[nodiscard]] Status add(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length);
  // kNotFound when the session holds no pin of exactly this (page-widened) range.
  [[nodiscard]] Status remove(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length);
  void drop_session(uint64_t session);

  // The parts of [offset, offset+length) of `arena` no pin covers, ascending: what may be
  // punched.
  [[nodiscard]] std::vector<std::pair<uint64_t, uint64_t>> unpinned(uint64_t arena, uint64_t offset,
                                                                    uint64_t length) const;
  [[nodiscard]] size_t size() const noexcept { return pins_.size(); }
  [[nodiscard]] uint64_t pinned_bytes() const noexcept;  // summed over pins (overlaps counted twice)

 private:
  struct Pin {
    uint64_t session, arena, begin, end;
  };
  std::vector<Pin> pins_;  // a handful per GPU rank: a linear scan beats an interval tree
};

}  // namespace tier::daemon
