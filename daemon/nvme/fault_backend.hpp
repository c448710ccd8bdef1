// FaultBackend: wraps another backend and injects failures per a schedule, for tests.
//
// Each rule matches operations (reads, writes or both) and fires either on exactly the Nth
// matching operation or with a probability per operation. Injections:
//   kEio, kEnospc, kEagain  the operation is not issued; it completes with -EIO/-ENOSPC/-EAGAIN
//   kShort                  the operation is issued for about half its length (kept a multiple
//                           of 4 KiB so O_DIRECT accepts it) and completes short; operations of
//                           4 KiB or less get -EAGAIN instead
//   kDelay                  the operation is issued, its completion held back delay_ms
// The first rule that fires decides. Same threading contract as every backend (one driver thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "nvme/io_backend.hpp"

namespace tier::nvme {

enum class FaultKind : uint8_t { kEio = 0, kEnospc = 1, kEagain = 2, kShort = 3, kDelay = 4 };
inline constexpr size_t kFaultKinds = 5;

struct FaultRule {
  FaultKind kind = FaultKind::kEio;
  std::optional<IoOp> op;        // match only this op; nullopt = reads and writes
  uint64_t nth = 0;              // fire on the nth matching op (1-based); 0 = use probability
  double probability = 0;        // when nth == 0: chance per matching op
  uint32_t delay_ms = 0;         // kDelay
  uint64_t max_fires = UINT64_MAX;
};

// Returns the wrapping backend; name() is "fault(<inner>)".
class FaultBackend;
[[nodiscard]] Result<std::unique_ptr<FaultBackend>> make_fault_backend(
    std::unique_ptr<IoBackend> inner, std::vector<FaultRule> rules, uint64_t seed = 1);

class FaultBackend : public IoBackend {
 public:
  // Replaces the schedule; counts of matching ops restart from zero. Driver thread only.
  virtual void set_rules(std::vector<FaultRule> rules) = 0;
  virtual uint64_t fired(FaultKind k) const noexcept = 0;
};

}  // namespace tier::nvme
