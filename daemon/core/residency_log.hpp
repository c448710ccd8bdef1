// ResidencyLog: where a tensor's copies are, as the journal must learn it. The NVMe tier
// reports every placement and drop through this interface and never sees the journal itself;
// Durability implements it (daemon/durability/durability.hpp). Called on the event loop only.
#pragma once

#include "tier/status.hpp"

namespace tier::nvme {
struct NvmeLocation;
}

namespace tier::daemon {

struct Tensor;

class ResidencyLog {
 public:
  virtual ~ResidencyLog() = default;
  virtual void ram_placed(const Tensor& t) = 0;   // t.ram is its new RAM copy
  virtual void ram_dropped(const Tensor& t) = 0;  // t has no RAM copy any more
  // Only after the write of `loc` completed (never for bytes in flight).
  virtual void nvme_copy_written(const Tensor& t, const nvme::NvmeLocation& loc) = 0;
  // The NVMe copy is freed or stale.
  virtual void nvme_copy_dropped(const Tensor& t) = 0;
  // Makes what was reported durable (before the change it enables, e.g. freeing RAM).
  [[nodiscard]] virtual Status commit() = 0;
};

}  // namespace tier::daemon
