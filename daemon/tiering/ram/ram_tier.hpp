// The RAM tier: the arenas of every pool, their extent allocators, and per-NUMA-node capacity.
//
// Capacity: the configured RAM tier is split across the topology's nodes in proportion to
// their memory. Usage counts allocated bytes (tensor sizes rounded to the allocation granule).
// A pool's arena on a node is created on its first tensor there, reserving the pool's RAM quota
// of address space; its object grows as extents are placed (Arena::commit), so a pool's arenas
// together hold what is placed on each node, not a quota per node; it is destroyed with the pool.
//
// DMA pins (ArenaPin, daemon/tiering/ram/dma_pins.hpp) keep their pages resident whether or not an extent
// holds them. Such pages count as used: a pool's footprint is its extents plus its pinned pages
// that no extent holds (Pool::ram_pinned, NodeUsage::pinned), and allocate() checks the pool's
// quota and the node's capacity against that footprint (an extent placed on pinned pages adds
// only what it adds). Freed extents and pages whose last pin goes are punched out of the arena
// (unless prefault keeps arenas populated), so what is not counted is not resident.
// Not thread-safe: owned by the daemon's event loop.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/catalog.hpp"
#include "core/config.hpp"
#include "ram/dma_pins.hpp"
#include "ram/arena.hpp"
#include "ram/extent_allocator.hpp"
#include "core/topology.hpp"

namespace tier::daemon {

struct RamTierOptions {
  std::string prefix;               // arena_prefix(state dir)
  uint64_t capacity = 0;            // the whole RAM tier, bytes
  uint64_t alignment = 2ull << 20;  // for tensors at least this large; smaller ones use 4 KiB
  HugePages hugepages = HugePages::kNone;
  std::string hugetlbfs_mount;
  bool prefault = false;  // config prefault: arenas are populated at creation
  // uid_ram_quota: what all the pools of one uid may hold in RAM together (extents plus pinned
  // pages no extent holds), checked at every allocation and pin; 0: unlimited. Root is not
  // limited. `uid_charged` says what a uid's pools hold now (the catalog knows its pools).
  uint64_t uid_quota = 0;
  std::function<uint64_t(uid_t)> uid_charged;
};

struct NodeUsage {
  int32_t node = 0;
  uint64_t capacity = 0, used = 0, tensors = 0;
  uint64_t pinned = 0;  // pinned pages no extent holds (resident, counted against capacity)
  [[nodiscard]] uint64_t charged() const noexcept { return used + pinned; }
};

class RamTier {
 public:
  RamTier(RamTierOptions opts, const Topology& topo);
  ~RamTier();  // unmaps arenas; their names stay unless remove_all() ran
  RamTier(const RamTier&) = delete;
  RamTier& operator=(const RamTier&) = delete;

  // Places `size` bytes of `pool` on `node`: checks the pool quota and the node's capacity,
  // creates the arena on first use. kResourceExhausted with the reason when it does not fit.
  // `packed`: after a compaction, a range at the granule's alignment does when none at the
  // tensor's alignment is free.
  [[nodiscard]] Result<RamLocation> allocate(Pool& pool, int32_t node, uint64_t size, bool packed = false);
  // Frees the extent; with `punch`, its pages no pin covers are punched out of the arena
  // (not with prefault). Without: they stay for an allocation about to reuse them.
  void release(Pool& pool, const RamLocation& loc, bool punch_pages = true);

  // DMA pins of `pool`'s arena `arena` (the caller checked the right and the range): pinned
  // pages count as the pool's (see above); unpinned ones no extent holds are punched.
  // kResourceExhausted past the uid's cap or DmaPins' count limits; kNotFound for an unknown pin.
  [[nodiscard]] Status pin(Pool& pool, uint64_t session, uid_t uid, uint64_t arena, uint64_t offset,
                           uint64_t length, uint64_t uid_cap);
  [[nodiscard]] Status unpin(Pool& pool, uint64_t session, uint64_t arena, uint64_t offset, uint64_t length);
  // A closed connection's pins go; `pool_of` finds a pool by id (null: gone).
  void drop_pins(uint64_t session, const std::function<Pool*(uint64_t)>& pool_of);
  [[nodiscard]] const DmaPins& pins() const noexcept { return pins_; }
  // Restart: re-attaches the pool's arena on `node` from the journaled object `path` (`size`
  // bytes reserved, at least `min_size` committed: the end of its last journaled extent).
  // kAttached: the object is tierd's own and was attached with its bytes. kGone: it did not
  // exist (a reboot). kRefused: it exists but Arena::attach() refused it (not tierd's: a
  // squatter; or truncated/grown through a tenant's fd): it is logged and removed. In both
  // latter cases an empty arena is created in its place (the caller restores the pool's
  // tensors from its snapshot). Errors: creating that arena failed.
  enum class Attach { kAttached, kGone, kRefused };
  [[nodiscard]] Result<Attach> attach_arena(const Pool& pool, int32_t node, const std::string& path,
                                            uint64_t size, uint64_t min_size);
  // Faults in the pool's arenas that the SIGBUS guard repaired (daemon/tiering/ram/fault_guard.hpp).
  [[nodiscard]] uint64_t arena_repairs(uint64_t pool_id) const noexcept;
  // Whether `path` is the object of a mapped arena.
  [[nodiscard]] bool has_object(const std::string& path) const noexcept;
  // Restart: marks a journaled extent of an attached arena used (pool quota and node usage
  // count it). kCorruption when it overlaps another or lies outside the arena.
  [[nodiscard]] Status reserve(Pool& pool, const RamLocation& loc);
  [[nodiscard]] Arena* arena(uint64_t id) noexcept;
  // Compaction (daemon/tiering/compact.cpp): the allocator of arena `id` (nullptr when none),
  // and the alignment allocate() gives `length` bytes.
  [[nodiscard]] ExtentAllocator* allocator(uint64_t id) noexcept;
  [[nodiscard]] uint64_t alignment_for(uint64_t length) const noexcept;
  // Moves the `loc.length` bytes at `loc` down to `offset` of the same arena (memmove: the
  // ranges may overlap); [offset, loc.offset) must be free. The usage counts do not change.
  // Nobody may read or write the bytes meanwhile (the caller moves only unleased tensors
  // without I/O in flight). kInvalidArgument when the range is not free.
  [[nodiscard]] Result<RamLocation> move_down(const RamLocation& loc, uint64_t offset);
  // Unlinks and unmaps every arena of the pool (its tensors are gone).
  void drop_pool(uint64_t pool_id);
  // Before drop_pool(): takes `bytes` in `tensors` extents of the pool on `node` off the usage
  // counts without freeing them one by one (their allocator goes with the arena).
  void forget_usage(Pool& pool, int32_t node, uint64_t bytes, uint64_t tensors);
  // Unlinks every arena (clean exit with remove_arenas_on_exit).
  void unlink_all();

  const std::vector<NodeUsage>& nodes() const noexcept { return nodes_; }
  uint64_t capacity() const noexcept { return opts_.capacity; }
  uint64_t used() const noexcept;
  uint64_t charged() const noexcept;  // used() plus pinned pages no extent holds
  size_t arena_count() const noexcept { return arenas_.size(); }
  // Bumped whenever an arena is mapped, unmapped or grown: memory registered elsewhere (io_uring fixed
  // buffers) must be re-registered before it is used again.
  uint64_t arena_generation() const noexcept { return generation_; }
  // Every mapped arena as (base, committed bytes).
  std::vector<std::pair<std::byte*, uint64_t>> arena_spans() const;
  const RamTierOptions& options() const noexcept { return opts_; }
  // Whether `adds` more bytes in `pool` would pass its owner's uid_ram_quota.
  [[nodiscard]] bool over_uid_quota(const Pool& pool, uint64_t adds) const;

 private:
  struct Entry {
    std::unique_ptr<Arena> arena;
    ExtentAllocator alloc;
    uint64_t pinned_free = 0;  // pinned pages no extent holds
  };
  NodeUsage* usage(int32_t node) noexcept;
  // Re-measures the arena's pinned pages that no extent holds and moves the difference into
  // the pool's and node's counts.
  void recount_pinned(Pool& pool, uint64_t arena_id);
  // Punches the pages of [begin, end) of the arena that no pin covers and no extent holds.
  void punch_unheld(uint64_t arena_id, uint64_t begin, uint64_t end);
  void punch(Entry& e, uint64_t offset, uint64_t length);
  // ok when `adds` more bytes fit the pool's quota and the node's capacity (counting pinned
  // pages); else kResourceExhausted naming which, for an extent of `need` bytes.
  [[nodiscard]] Status fits(const Pool& pool, const NodeUsage& nu, uint64_t adds, uint64_t need) const;

  RamTierOptions opts_;
  std::vector<NodeUsage> nodes_;
  std::map<uint64_t, Entry> arenas_;  // by arena id: pool-major, so a pool's arenas are adjacent
  DmaPins pins_;
  uint64_t generation_ = 0;
};

}  // namespace tier::daemon
