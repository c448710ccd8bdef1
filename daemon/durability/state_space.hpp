// Space in the state directory's file system, which the journal and the snapshots share
// (docs/daemon.md, "State directory space").
//
// A tenant can fill that file system only through snapshots of its pools, so a snapshot is
// admitted only when, after it and every snapshot still being written, the file system keeps at
// least `floor` bytes free (snapshot_free_floor). Space the tenant cannot reach backs the
// journal: a preallocated reserve file <state-dir>/journal/reserve of `reserve` bytes
// (journal_reserve). When an append finds the disk full anyway (something else filled it), the
// reserve is given back to the file system and the append retried, so tierd goes on
// acknowledging changes; snapshots are refused until the reserve can be taken again.
//
// Not thread-safe: the event loop owns it.
#pragma once

#include <cstdint>
#include <string>

#include "tier/status.hpp"

namespace tier::daemon {

class StateSpace {
 public:
  StateSpace() = default;
  // Sizes are parse_size() text; a percentage is of the state dir's file system. Creates and
  // preallocates the reserve file (on a disk too full for it: logged, and taken back later).
  [[nodiscard]] static Result<StateSpace> open(const std::string& state_dir, const std::string& floor_text,
                                               const std::string& reserve_text);
  StateSpace(StateSpace&& o) noexcept { *this = std::move(o); }
  StateSpace& operator=(StateSpace&& o) noexcept;
  StateSpace(const StateSpace&) = delete;
  StateSpace& operator=(const StateSpace&) = delete;
  ~StateSpace();

  // ok, or kResourceExhausted naming the floor: writing `bytes` more beside `pending` bytes of
  // snapshots still being written would leave less than the floor free, or the reserve is
  // released and cannot be taken back. Without open() (no state dir checks): always ok.
  [[nodiscard]] Status admit(uint64_t bytes, uint64_t pending);
  // The journal found the disk full: gives the reserve back to the file system. False when
  // there was none left to give.
  bool release_reserve();
  bool reserve_released() const noexcept { return fd_ >= 0 && !held_; }
  uint64_t floor() const noexcept { return floor_; }
  uint64_t reserve() const noexcept { return reserve_; }
  // Free bytes for tierd (statvfs f_bavail), or an error.
  [[nodiscard]] Result<uint64_t> free_bytes() const;

 private:
  // Preallocates the reserve file; kResourceExhausted when the disk cannot hold it.
  [[nodiscard]] Status take_reserve();

  std::string dir_, reserve_path_;
  int fd_ = -1;  // the reserve file
  bool held_ = false;
  uint64_t floor_ = 0, reserve_ = 0;
};

}  // namespace tier::daemon
