#include "nvme/hash_pool.hpp"

#include <unistd.h>

#include "nvme/location.hpp"

namespace tier::nvme {

HashPool::HashPool(unsigned threads, int notify_fd) : notify_fd_(notify_fd) {
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

HashPool::~HashPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void HashPool::submit(uint64_t tag, const std::byte* data, size_t len) {
  if (workers_.empty()) {
    done({tag, extent_checksum({data, len})});
    return;
  }
  {
    std::lock_guard lk(mu_);
    jobs_.push_back({tag, data, len});
  }
  cv_.notify_one();
}

void HashPool::take(std::vector<Result>& out) {
  std::lock_guard lk(mu_);
  out.insert(out.end(), results_.begin(), results_.end());
  results_.clear();
}

void HashPool::done(Result r) {
  {
    std::lock_guard lk(mu_);
    results_.push_back(r);
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(notify_fd_, &one, sizeof one);
}

void HashPool::work() {
  for (;;) {
    Job j;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      j = jobs_.front();
      jobs_.pop_front();
    }
    done({j.tag, extent_checksum({j.data, j.len})});
  }
}

}  // namespace tier::nvme
