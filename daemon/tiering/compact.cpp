// NvmeTier::compact: makes a contiguous free range in a pool's arena by moving unleased tensors
// together (issue 33: free RAM in pieces must not make an acknowledged tensor unreadable when
// the tensors left in RAM cannot be written back, e.g. with the NVMe tier full).
//
// Packing: the pool's tensors in the arena, in offset order, each moved down (memmove) to the
// lowest offset above the previous one, when it is movable (evictable(): unleased, unpinned, no
// I/O in flight) and the range below it is free; an unmovable tensor, or a range allocated to
// no tensor (a fetch in flight fills it), stays where it is. The first pass keeps each tensor's
// alignment; when that leaves no free range of the size, a second pass packs at the granule
// (tensors of 2 MiB and more lose their alignment: readable beats aligned) and the allocation
// that follows may then take an unaligned range (RamTier::allocate's `packed`). Each move is
// journaled like any RAM placement.
#include <algorithm>
#include <vector>

#include "base/log.hpp"
#include "ram/arena.hpp"
#include "tiering/nvme_tier.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

namespace {

// Whether [begin, end) is wholly free in `alloc`.
bool all_free(const ExtentAllocator& alloc, uint64_t begin, uint64_t end) {
  uint64_t n = 0;
  for (const auto& [off, len] : alloc.free_within(begin, end)) n += len;
  return n == end - begin;
}

}  // namespace

uint64_t NvmeTier::pack(Pool& pool, uint64_t arena, bool keep_alignment, uint64_t& bytes) {
  ExtentAllocator& alloc = *ram_.allocator(arena);
  std::vector<Tensor*> in;  // the pool's tensors in this arena, by offset
  for (auto& [id, t] : pool.tensors)
    if (t.ram && t.ram->arena_id == arena) in.push_back(&t);
  std::sort(in.begin(), in.end(),
            [](const Tensor* a, const Tensor* b) { return a->ram->offset < b->ram->offset; });
  uint64_t pos = 0, moved = 0;
  for (Tensor* t : in) {
    const RamLocation r = *t->ram;
    const uint64_t align = keep_alignment ? ram_.alignment_for(r.length) : ExtentAllocator::kGranule;
    const uint64_t target = ExtentAllocator::round_up(pos, align);
    if (target >= r.offset || !evictable(*t) || !all_free(alloc, target, r.offset)) {
      pos = r.offset + r.length;
      continue;
    }
    auto to = ram_.move_down(r, target);
    if (!to) {
      pos = r.offset + r.length;
      continue;
    }
    t->ram = *to;
    if (durable_) durable_->ram_placed(*t);
    pos = to->offset + to->length;
    ++moved;
    bytes += to->length;
  }
  return moved;
}

bool NvmeTier::compact(Pool& pool, int32_t node, uint64_t size) {
  const uint64_t aid = arena_id(pool.id, node);
  const ExtentAllocator* alloc = ram_.allocator(aid);
  const uint64_t need = ExtentAllocator::round_up(size, ExtentAllocator::kGranule);
  if (!alloc || alloc->free_bytes() < need) return false;
  uint64_t bytes = 0;
  uint64_t moved = pack(pool, aid, /*keep_alignment=*/true, bytes);
  if (alloc->largest_free() < need) moved += pack(pool, aid, /*keep_alignment=*/false, bytes);
  if (moved > 0)
    log_info(
        "pool '{}': compacted its arena on node {}: moved {} tensors ({}); largest free range {}, {} needed",
        pool.name, node, moved, format_size(bytes), format_size(alloc->largest_free()), format_size(need));
  return moved > 0 && alloc->largest_free() >= need;
}

}  // namespace tier::daemon
