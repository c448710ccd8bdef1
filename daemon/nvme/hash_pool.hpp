// HashPool: computes extent checksums (XXH3_64bits) on worker threads, so the event loop keeps
// submitting I/O while bytes are hashed and hashing scales past one core.
//
// submit() queues a job; results come back through take() on the driver thread, and each
// finished job writes 1 to `notify_fd` (an eventfd the owner polls). The memory a job hashes must
// stay valid and unchanged until its result is taken. With zero threads, jobs run inside
// submit() (results still come through take()).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace tier::nvme {

class HashPool {
 public:
  struct Result {
    uint64_t tag = 0;
    uint64_t hash = 0;
  };

  HashPool(unsigned threads, int notify_fd);
  ~HashPool();  // finishes queued jobs first
  HashPool(const HashPool&) = delete;
  HashPool& operator=(const HashPool&) = delete;

  void submit(uint64_t tag, const std::byte* data, size_t len);
  // Appends finished results to `out`; never blocks.
  void take(std::vector<Result>& out);
  size_t threads() const noexcept { return workers_.size(); }

 private:
  struct Job {
    uint64_t tag;
    const std::byte* data;
    size_t len;
  };
  void work();
  void done(Result r);

  int notify_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;       // guarded by mu_
  std::vector<Result> results_;  // guarded by mu_
  bool stop_ = false;          // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace tier::nvme
