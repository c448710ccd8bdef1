#include "ram/prefault.hpp"
#include "base/errors.hpp"

#include <numa.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

namespace tier::daemon {

namespace {

// Returns 0 or an errno.
int touch(std::byte* p, uint64_t n, uint64_t page, std::atomic<bool>& use_madvise) {
  if (n == 0) return 0;
  if (use_madvise.load(std::memory_order_relaxed)) {
    if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return 0;
    if (errno != EINVAL) return errno;                    // ENOMEM/EFAULT: out of memory or huge pages
    use_madvise.store(false, std::memory_order_relaxed);  // kernel older than 5.14
  }
  for (uint64_t off = 0; off < n; off += page) {
    volatile std::byte* b = p + off;
    *b = *b;  // a write fault allocates the page; the content (zero) is kept
  }
  return 0;
}

}  // namespace

Result<PrefaultStats> prefault(std::byte* base, uint64_t size, int os_node, unsigned threads, uint64_t page) {
  auto t0 = std::chrono::steady_clock::now();
  if (page == 0) page = 4096;
  if (threads == 0) {
    unsigned cpus = std::thread::hardware_concurrency();
    if (os_node >= 0 && numa_available() >= 0) {
      bitmask* m = numa_allocate_cpumask();
      if (numa_node_to_cpus(os_node, m) == 0) cpus = numa_bitmask_weight(m);
      numa_free_cpumask(m);
    }
    threads = std::clamp(cpus, 1u, 16u);
  }
  uint64_t pages = size / page;
  threads = static_cast<unsigned>(std::min<uint64_t>(threads, std::max<uint64_t>(pages, 1)));
  std::atomic<bool> use_madvise{true};
  std::vector<int> errs(threads, 0);
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    uint64_t first = pages * i / threads, last = pages * (i + 1) / threads;
    pool.emplace_back([&, i, first, last] {
      if (os_node >= 0 && numa_available() >= 0) (void)numa_run_on_node(os_node);
      errs[i] = touch(base + first * page, (last - first) * page, page, use_madvise);
    });
  }
  for (auto& t : pool) t.join();
  for (int e : errs)
    if (e != 0) return fail(Status::from_errno(e, "prefault of an arena"));
  PrefaultStats s;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.populate_write = use_madvise.load();
  return s;
}

}  // namespace tier::daemon
