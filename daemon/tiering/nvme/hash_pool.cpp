#include "nvme/hash_pool.hpp"

#include "nvme/location.hpp"

namespace tier::nvme {

HashPool::HashPool(unsigned threads, int notify_fd)
    : pool_(threads, notify_fd, [](Job& j) { return Result{j.tag, extent_checksum({j.data, j.len})}; }) {}

void HashPool::submit(uint64_t tag, const std::byte* data, size_t len) { pool_.submit({tag, data, len}); }

void HashPool::take(std::vector<Result>& out) { pool_.take(out); }

}  // namespace tier::nvme
