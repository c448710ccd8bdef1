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
// Pinned pages are resident whether or not an extent holds them, so they are charged: the
// RAM tier (daemon/tiering/ram/ram_tier.hpp) counts the pinned pages no extent holds as used by the
// arena's pool and node, and punches them when their last pin goes. Each pin also counts
// against its uid's pinned bytes (uid_bytes(); overlapping pins counted each time), which add()
// keeps under a cap (Config::uid_pinned_quota).
// Thread-safety: none; the daemon's loop thread owns it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tier/status.hpp"

namespace tier::daemon {

class DmaPins {
 public:
  static constexpr uint64_t kPage = 4096;
  static constexpr size_t kMaxPinsPerSession = 4096;
  static constexpr size_t kMaxPinsPerUid = 65536;  // over all of a uid's connections

  using Range = std::pair<uint64_t, uint64_t>;  // [first, second) of one arena
  struct Gone {
    uint64_t arena;
    Range range;
  };

  // kResourceExhausted past kMaxPinsPerSession pins of one session, or when `uid`'s pinned
  // bytes would pass `uid_cap`; kInvalidArgument for an empty or overflowing range.
  [[nodiscard]] Status add(uint64_t session, uid_t uid, uint64_t arena, uint64_t offset, uint64_t length,
                           uint64_t uid_cap = UINT64_MAX);
  [[nodiscard]] Status add(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length) {
    return add(session, 0, arena, offset, length);
  }
  // kNotFound when the session holds no pin of exactly this (page-widened) range. `gone` (when
  // not null) receives the removed page range.
  [[nodiscard]] Status remove(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length,
                              Range* gone = nullptr);
  // Removes every pin of the session (or of the arena) and says which ranges they covered.
  std::vector<Gone> drop_session(uint64_t session);
  std::vector<Gone> drop_arena(uint64_t arena);
  // The union of the pins of `arena`, merged, ascending.
  [[nodiscard]] std::vector<Range> covered(uint64_t arena) const;
  // Bytes of [offset, offset+length) of `arena` some pin covers.
  [[nodiscard]] uint64_t overlap(uint64_t arena, uint64_t offset, uint64_t length) const;
  // Pinned bytes of `uid`'s pins (overlaps counted each time).
  [[nodiscard]] uint64_t uid_bytes(uid_t uid) const noexcept;

  // The parts of [offset, offset+length) of `arena` no pin covers, ascending: what may be
  // punched.
  [[nodiscard]] std::vector<std::pair<uint64_t, uint64_t>> unpinned(uint64_t arena, uint64_t offset,
                                                                    uint64_t length) const;
  [[nodiscard]] size_t size() const noexcept { return count_; }
  [[nodiscard]] uint64_t pinned_bytes() const noexcept;  // summed over pins (overlaps counted twice)

 private:
  struct Pin {
    uint64_t session, begin, end;
    uid_t uid;
  };
  struct UidCount {
    uint64_t bytes = 0;
    size_t pins = 0;
  };
  void uncount(const Pin& p);
  template <class Pred> std::vector<Gone> drop_if(Pred pred);
  // By arena: a handful per GPU rank, so a linear scan of an arena's pins beats an interval
  // tree, and arenas nobody pinned cost one lookup.
  std::unordered_map<uint64_t, std::vector<Pin>> pins_;
  std::unordered_map<uid_t, UidCount> uids_;
  std::unordered_map<uint64_t, size_t> sessions_;  // pins per session
  size_t count_ = 0;
};

}  // namespace tier::daemon
