// Pre-faulting of arenas (config prefault = true): every page of an arena is allocated and
// zeroed when the arena is created, by `threads` threads that run on the arena's NUMA node, so
// that the first lease of a fresh tensor does not pay for page faults and the memory is really
// there (or the failure shows at creation, not as SIGBUS in a trainer).
//
// Each thread takes an equal slice of whole pages and calls madvise(MADV_POPULATE_WRITE)
// (Linux 5.14+); on older kernels (EINVAL) it writes one byte per page instead. The mapping's
// NUMA policy (mbind before first touch) decides where the pages land; running the threads on
// that node keeps the zeroing local. Blocks until every thread is done.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tier/status.hpp"

namespace tier::daemon {

struct PrefaultStats {
  double seconds = 0;
  bool populate_write = false;  // MADV_POPULATE_WRITE was used (else byte writes)
};

// `os_node` -1: do not bind the threads. `threads` 0: one per CPU of the node, at most 16.
// `page` is the mapping's page size (4 KiB or the huge page size).
[[nodiscard]] Result<PrefaultStats> prefault(std::byte* base, uint64_t size, int os_node, unsigned threads,
                                             uint64_t page);

}  // namespace tier::daemon
