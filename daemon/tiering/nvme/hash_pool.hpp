// HashPool: computes extent checksums (XXH3_64bits) on worker threads, so the event loop keeps
// submitting I/O while bytes are hashed and hashing scales past one core.
//
// submit() queues a job; results come back through take() on the driver thread, and each
// finished job writes 1 to `notify_fd` (an eventfd the owner polls). The memory a job hashes must
// stay valid and unchanged until its result is taken. With zero threads, jobs run inside
// submit() (results still come through take()). Threads and queue: WorkerPool (its contracts
// apply: `notify_fd` must outlive the pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nvme/worker_pool.hpp"

namespace tier::nvme {

class HashPool {
 public:
  struct Result {
    uint64_t tag = 0;
    uint64_t hash = 0;
  };

  HashPool(unsigned threads, int notify_fd);
  // The destructor finishes queued jobs first.

  void submit(uint64_t tag, const std::byte* data, size_t len);
  // Appends finished results to `out`; never blocks.
  void take(std::vector<Result>& out);
  size_t threads() const noexcept { return pool_.threads(); }

 private:
  struct Job {
    uint64_t tag = 0;
    const std::byte* data = nullptr;
    size_t len = 0;
  };
  WorkerPool<Job, Result> pool_;
};

}  // namespace tier::nvme
