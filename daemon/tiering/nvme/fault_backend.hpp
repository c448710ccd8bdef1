// FaultBackend: wraps another backend and injects failures per a schedule, for tests.
//
// Each rule matches operations (reads, writes, syncs, or any) and fires either on exactly the Nth
// matching operation or with a probability per operation. Injections:
//   kEio, kEnospc, kEagain  the operation is not issued; it completes with -EIO/-ENOSPC/-EAGAIN
//   kShort                  the operation is issued for about half its length (kept a multiple
//                           of 4 KiB so O_DIRECT accepts it) and completes short; operations of
//                           4 KiB or less (and syncs) get -EAGAIN instead
//   kDelay                  the operation is issued, its completion held back delay_ms
//   kHold                   the operation is issued, its completion held back until
//                           release_held() (deterministic interleavings in tests)
// The first rule that fires decides; a rule with no op matches every operation. Same threading
// contract as every backend (one driver thread).
//
// Power loss: the backend also models the drive's volatile write cache. A write issued to the
// inner backend is volatile until a sync of its file completes that was submitted after the
// write's completion had been reaped (reported to the caller); a sync covers nothing still in
// flight or not yet reported, and a sync only counts once its own completion is reported (one
// that failed, was injected or is still held back counts for nothing). power_loss() then
// forgets every volatile write: its range reads as zeros afterwards (what a preallocated,
// unwritten extent reads as), whatever it held before. Conservative: anything the caller could
// not yet know to be durable is lost.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "nvme/io_backend.hpp"

namespace tier::nvme {

enum class FaultKind : uint8_t { kEio = 0, kEnospc = 1, kEagain = 2, kShort = 3, kDelay = 4, kHold = 5 };
inline constexpr size_t kFaultKinds = 6;

struct FaultRule {
  FaultKind kind = FaultKind::kEio;
  std::optional<IoOp> op;  // match only this op; nullopt = every op (syncs too)
  uint64_t nth = 0;        // fire on the nth matching op (1-based); 0 = use probability
  double probability = 0;  // when nth == 0: chance per matching op
  uint32_t delay_ms = 0;   // kDelay
  uint64_t max_fires = UINT64_MAX;
};

// Returns the wrapping backend; name() is "fault(<inner>)".
class FaultBackend;
[[nodiscard]] Result<std::unique_ptr<FaultBackend>> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                                                       std::vector<FaultRule> rules,
                                                                       uint64_t seed = 1);

class FaultBackend : public IoBackend {
 public:
  // Replaces the schedule; counts of matching ops restart from zero. Driver thread only.
  virtual void set_rules(std::vector<FaultRule> rules) = 0;
  virtual uint64_t fired(FaultKind k) const noexcept = 0;
  // kHold: completions that came back from the inner backend and are held (not yet reported).
  virtual size_t holding() const noexcept = 0;
  // Reports every held completion at the next reap() (the event fd becomes readable).
  virtual void release_held() = 0;
  // Called with the completion of each write and sync issued to the inner backend as reap()
  // reports it (before the caller sees it; injected failures are not passed); empty = none. For tests that
  // check what happened in which order.
  using Observer = std::function<void(IoOp op, const IoCompletion& c)>;
  virtual void set_observer(Observer o) = 0;

  // Bytes written that no reported sync has made durable yet (see above).
  virtual uint64_t volatile_bytes() const noexcept = 0;
  // Simulated power loss. Waits until the inner backend has finished what was issued to it,
  // then overwrites every volatile range with zeros (through its own descriptor, without
  // O_DIRECT, synced). From then on the device is off: every operation not yet reported, and
  // every later one, completes with -EIO without being issued. Returns the bytes forgotten;
  // an error when a range could not be overwritten. Driver thread only; at most once.
  [[nodiscard]] virtual Result<uint64_t> power_loss() = 0;
  virtual bool powered_off() const noexcept = 0;
};

}  // namespace tier::nvme
