#include "ram/ram_tier.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "base/log.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

RamTier::RamTier(RamTierOptions opts, const Topology& topo) : opts_(std::move(opts)) {
  uint64_t total_mem = topo.total_memory();
  uint64_t assigned = 0;
  for (size_t i = 0; i < topo.nodes.size(); ++i) {
    const auto& n = topo.nodes[i];
    uint64_t cap;
    if (i + 1 == topo.nodes.size()) cap = opts_.capacity - assigned;
    else if (total_mem > 0)
      cap = static_cast<uint64_t>(static_cast<long double>(opts_.capacity) * n.memory / total_mem);
    else cap = opts_.capacity / topo.nodes.size();
    assigned += cap;
    nodes_.push_back(NodeUsage{n.id, cap, 0, 0});
  }
}

RamTier::~RamTier() = default;

NodeUsage* RamTier::usage(int32_t node) noexcept {
  for (auto& n : nodes_)
    if (n.node == node) return &n;
  return nullptr;
}

uint64_t RamTier::used() const noexcept {
  uint64_t u = 0;
  for (const auto& n : nodes_) u += n.used;
  return u;
}

uint64_t RamTier::charged() const noexcept {
  uint64_t u = 0;
  for (const auto& n : nodes_) u += n.charged();
  return u;
}

Result<RamLocation> RamTier::allocate(Pool& pool, int32_t node, uint64_t size, bool packed) {
  NodeUsage* nu = usage(node);
  if (!nu) return fail(Code::kInvalidArgument, "NUMA node " + std::to_string(node) + " has no RAM tier");
  uint64_t gran = ExtentAllocator::kGranule;
  uint64_t align = size >= opts_.alignment ? opts_.alignment : gran;
  uint64_t need = ExtentAllocator::round_up(size, gran);
  if (need < size) return fail(Code::kInvalidArgument, "tensor size overflows");
  uint64_t id = arena_id(pool.id, node);
  auto it = arenas_.find(id);
  // An extent on pinned pages adds less than `need`; how much is known once it is placed.
  const uint64_t relief = it == arenas_.end() ? 0 : std::min(need, it->second.pinned_free);
  TIER_TRY(fits(pool, *nu, need - relief, need));
  if (it == arenas_.end()) {
    ArenaSpec spec{opts_.prefix,   pool.id, node, pool.ram_quota, opts_.hugepages, opts_.hugetlbfs_mount,
                   opts_.prefault, {},      0};
    auto a = Arena::create(spec);
    TIER_TRY(a);
    uint64_t cap = (*a)->size();
    log_info("pool '{}': arena {} on node {} ({} reserved, grown as placed{})", pool.name, (*a)->path(), node,
             format_size(cap), (*a)->os_node() >= 0 ? ", bound" : ", unbound");
    it = arenas_.emplace(id, Entry{std::move(*a), ExtentAllocator(cap)}).first;
    ++generation_;
  }
  auto off = it->second.alloc.allocate(need, align);
  if (!off && packed && align > gran) off = it->second.alloc.allocate(need, gran);
  if (!off)
    return fail(Code::kResourceExhausted, "pool '" + pool.name + "': no free range of " + format_size(need) +
                                              " in its arena on node " + std::to_string(node) + " (" +
                                              format_size(it->second.alloc.free_bytes()) + " free, largest " +
                                              format_size(it->second.alloc.largest_free()) + ")");
  Arena& arena = *it->second.arena;
  uint64_t before = arena.committed();
  if (Status st = arena.commit(*off + need); !st) {
    (void)it->second.alloc.free(*off, need);
    return fail(Code::kResourceExhausted, "pool '" + pool.name + "': " + st.message());
  }
  if (arena.committed() != before) ++generation_;
  const uint64_t pinned = pins_.overlap(id, *off, need);
  if (pinned < relief) {  // placed off the pinned pages: check what it really adds
    if (Status st = fits(pool, *nu, need - pinned, need); !st) {
      (void)it->second.alloc.free(*off, need);
      return fail(std::move(st));
    }
  }
  it->second.pinned_free -= std::min(it->second.pinned_free, pinned);
  pool.ram_pinned -= std::min(pool.ram_pinned, pinned);
  nu->pinned -= std::min(nu->pinned, pinned);
  pool.ram_used += need;
  nu->used += need;
  nu->tensors += 1;
  return RamLocation{id, node, *off, need};
}

Status RamTier::fits(const Pool& pool, const NodeUsage& nu, uint64_t adds, uint64_t need) const {
  const std::string pinned = pool.ram_pinned > 0 ? ", " + format_size(pool.ram_pinned) + " of it pinned" : "";
  if (pool.ram_charged() + adds > pool.ram_quota)
    return Status(Code::kResourceExhausted,
                  "pool '" + pool.name + "' RAM quota of " + format_size(pool.ram_quota) + " reached (used " +
                      format_size(pool.ram_charged()) + pinned + ", need " + format_size(need) + ")");
  if (over_uid_quota(pool, adds))
    return Status(Code::kResourceExhausted,
                  "uid " + std::to_string(pool.owner_uid) + " RAM quota of " + format_size(opts_.uid_quota) +
                      " reached (uid_ram_quota: its pools hold " +
                      format_size(opts_.uid_charged(pool.owner_uid)) + ", need " + format_size(need) + ")");
  if (nu.charged() + adds > nu.capacity)
    return Status(Code::kResourceExhausted,
                  "RAM tier of NUMA node " + std::to_string(nu.node) + " is full (" +
                      format_size(nu.charged()) + " of " + format_size(nu.capacity) + " used" +
                      (nu.pinned > 0 ? ", " + format_size(nu.pinned) + " of it pinned for DMA" : "") +
                      ", need " + format_size(need) + ")");
  return Status::ok();
}

bool RamTier::over_uid_quota(const Pool& pool, uint64_t adds) const {
  if (opts_.uid_quota == 0 || pool.owner_uid == 0 || !opts_.uid_charged) return false;
  return opts_.uid_charged(pool.owner_uid) + adds > opts_.uid_quota;
}

ExtentAllocator* RamTier::allocator(uint64_t id) noexcept {
  auto it = arenas_.find(id);
  return it == arenas_.end() ? nullptr : &it->second.alloc;
}

uint64_t RamTier::alignment_for(uint64_t length) const noexcept {
  return length >= opts_.alignment ? opts_.alignment : ExtentAllocator::kGranule;
}

Result<RamLocation> RamTier::move_down(const RamLocation& loc, uint64_t offset) {
  auto it = arenas_.find(loc.arena_id);
  if (it == arenas_.end()) return fail(Code::kInternal, "move: no arena " + std::to_string(loc.arena_id));
  ExtentAllocator& alloc = it->second.alloc;
  // Pinned pages are charged by where they lie (pinned_free, the pool's and node's pinned
  // counts): a move across them would leave those counts wrong, so an arena with pins stays put.
  if (!pins_.covered(loc.arena_id).empty()) return fail(Code::kBusy, "move: the arena has DMA pins");
  if (offset >= loc.offset || !alloc.free(loc.offset, loc.length))
    return fail(Code::kInvalidArgument, "move: bad range");
  if (!alloc.reserve(offset, loc.length)) {
    (void)alloc.reserve(loc.offset, loc.length);  // just freed: cannot fail
    return fail(Code::kInvalidArgument, "move: the range below is not free");
  }
  std::byte* base = it->second.arena->base();
  std::memmove(base + offset, base + loc.offset, loc.length);
  // The part of the old range the new one does not cover is free now: give its pages back.
  const uint64_t tail = std::max(offset + loc.length, loc.offset);
  punch(it->second, tail, loc.offset + loc.length - tail);
  RamLocation moved = loc;
  moved.offset = offset;
  return moved;
}

void RamTier::release(Pool& pool, const RamLocation& loc, bool punch_pages) {
  auto it = arenas_.find(loc.arena_id);
  if (it == arenas_.end() || !it->second.alloc.free(loc.offset, loc.length)) {
    log_error("internal: release of an unknown extent (arena {}, offset {}, {} bytes)", loc.arena_id,
              loc.offset, loc.length);
    return;
  }
  // Pinned pages stay resident: they move from the extent to the pool's pinned count.
  const uint64_t pinned = pins_.overlap(loc.arena_id, loc.offset, loc.length);
  it->second.pinned_free += pinned;
  pool.ram_pinned += pinned;
  pool.ram_used -= std::min(pool.ram_used, loc.length);
  if (NodeUsage* nu = usage(loc.node)) {
    nu->used -= std::min(nu->used, loc.length);
    nu->tensors -= nu->tensors > 0 ? 1 : 0;
    nu->pinned += pinned;
  }
  if (punch_pages)
    for (auto [off, len] : pins_.unpinned(loc.arena_id, loc.offset, loc.length)) punch(it->second, off, len);
}

void RamTier::punch(Entry& e, uint64_t offset, uint64_t length) {
  // Give the pages back: the arena is sparse shared memory and freeing an extent alone would
  // keep them resident. On hugetlbfs only whole huge pages can be punched; a refusal just
  // keeps the pages. With prefault the arena stays populated (io_uring fixed buffers).
  if (opts_.prefault || length == 0) return;
  if (::fallocate(e.arena->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) != 0)
    log_debug("punching {} bytes at {} of {}: {}", length, offset, e.arena->path(), std::strerror(errno));
}

void RamTier::punch_unheld(uint64_t arena_id, uint64_t begin, uint64_t end) {
  auto it = arenas_.find(arena_id);
  if (it == arenas_.end()) return;
  for (auto [off, len] : pins_.unpinned(arena_id, begin, end - begin))
    for (auto [foff, flen] : it->second.alloc.free_within(off, off + len)) punch(it->second, foff, flen);
}

void RamTier::recount_pinned(Pool& pool, uint64_t arena_id) {
  auto it = arenas_.find(arena_id);
  if (it == arenas_.end()) return;
  uint64_t now = 0;
  for (auto [b, e] : pins_.covered(arena_id))
    for (auto [off, len] : it->second.alloc.free_within(b, e)) now += len;
  Entry& en = it->second;
  NodeUsage* nu = usage(arena_node(arena_id));
  pool.ram_pinned -= std::min(pool.ram_pinned, en.pinned_free);
  if (nu) nu->pinned -= std::min(nu->pinned, en.pinned_free);
  en.pinned_free = now;
  pool.ram_pinned += now;
  if (nu) nu->pinned += now;
}

Status RamTier::pin(Pool& pool, uint64_t session, uid_t uid, uint64_t arena, uint64_t offset, uint64_t length,
                    uint64_t uid_cap) {
  TIER_TRY(pins_.add(session, uid, arena, offset, length, uid_cap));
  const uint64_t before = pool.ram_pinned;
  recount_pinned(pool, arena);
  const NodeUsage* nu = usage(arena_node(arena));
  const bool over_uid = pool.ram_pinned > before && over_uid_quota(pool, 0);
  if (pool.ram_pinned > before &&
      (pool.ram_charged() > pool.ram_quota || over_uid || (nu && nu->charged() > nu->capacity))) {
    // Pages the tier cannot hold: refused, so that what is pinned always fits what is counted.
    std::string why;
    if (pool.ram_charged() > pool.ram_quota)
      why = "pool '" + pool.name + "' RAM quota of " + format_size(pool.ram_quota);
    else if (over_uid)
      why = "uid " + std::to_string(pool.owner_uid) + " RAM quota of " + format_size(opts_.uid_quota) +
            " (uid_ram_quota)";
    else why = "RAM tier of NUMA node " + std::to_string(nu->node) + " (" + format_size(nu->capacity) + ")";
    const uint64_t adds = pool.ram_pinned - before;
    (void)pins_.remove(session, arena, offset, length);
    recount_pinned(pool, arena);
    return Status(Code::kResourceExhausted, "pinning " + format_size(adds) +
                                                " of arena pages no tensor holds " + "would pass the " + why +
                                                "; pinned pages count as used");
  }
  return Status::ok();
}

Status RamTier::unpin(Pool& pool, uint64_t session, uint64_t arena, uint64_t offset, uint64_t length) {
  DmaPins::Range gone;
  TIER_TRY(pins_.remove(session, arena, offset, length, &gone));
  punch_unheld(arena, gone.first, gone.second);
  recount_pinned(pool, arena);
  return Status::ok();
}

void RamTier::drop_pins(uint64_t session, const std::function<Pool*(uint64_t)>& pool_of) {
  std::vector<DmaPins::Gone> gone = pins_.drop_session(session);
  for (const DmaPins::Gone& g : gone) punch_unheld(g.arena, g.range.first, g.range.second);
  for (const DmaPins::Gone& g : gone)
    if (Pool* p = pool_of(arena_pool(g.arena))) recount_pinned(*p, g.arena);
}

Result<RamTier::Attach> RamTier::attach_arena(const Pool& pool, int32_t node, const std::string& path,
                                              uint64_t size, uint64_t min_size) {
  uint64_t id = arena_id(pool.id, node);
  if (arenas_.contains(id)) return Attach::kAttached;
  ArenaSpec spec{opts_.prefix,          pool.id,        node, size,    opts_.hugepages,
                 opts_.hugetlbfs_mount, opts_.prefault, path, min_size};
  Attach outcome = Attach::kAttached;
  auto a = Arena::attach(spec);
  if (!a) {
    outcome = a.error().code() == Code::kNotFound ? Attach::kGone : Attach::kRefused;
    if (outcome == Attach::kRefused) {
      // Never used: not mapped, its bytes never read. Removed so the name is free and the
      // object (a squatter's or a damaged one) cannot come back at the next start.
      bool removed = Arena::remove_object(path, opts_.hugepages != HugePages::kNone);
      log_error("pool '{}': {}; it is not used{}, the pool's tensors come from its snapshot or NVMe copies",
                pool.name, a.error().message(), removed ? " and was removed" : "");
    }
    a = Arena::create(spec);
  }
  TIER_TRY(a);
  uint64_t cap = (*a)->size();
  arenas_.emplace(id, Entry{std::move(*a), ExtentAllocator(cap)});
  ++generation_;
  return outcome;
}

uint64_t RamTier::arena_repairs(uint64_t pool_id) const noexcept {
  uint64_t n = 0;
  for (auto it = arenas_.lower_bound(arena_id(pool_id, 0));
       it != arenas_.end() && arena_pool(it->first) == pool_id; ++it)
    n += it->second.arena->repairs();
  return n;
}

bool RamTier::has_object(const std::string& path) const noexcept {
  for (const auto& [id, e] : arenas_)
    if (e.arena->path() == path) return true;
  return false;
}

Status RamTier::reserve(Pool& pool, const RamLocation& loc) {
  auto it = arenas_.find(loc.arena_id);
  if (it == arenas_.end())
    return Status(Code::kCorruption,
                  "extent in arena " + std::to_string(loc.arena_id) + " that is not attached");
  if (!it->second.alloc.reserve(loc.offset, loc.length))
    return Status(Code::kCorruption,
                  "extent [" + std::to_string(loc.offset) + ", +" + std::to_string(loc.length) +
                      ") of arena " + std::to_string(loc.arena_id) + " overlaps another or lies outside it");
  // A re-created arena (gone in a reboot, or refused) is empty: commit what the snapshot
  // restore writes into.
  if (Status st = it->second.arena->commit(loc.offset + loc.length); !st) {
    (void)it->second.alloc.free(loc.offset, loc.length);
    return st;
  }
  ++generation_;
  pool.ram_used += loc.length;
  if (NodeUsage* nu = usage(loc.node)) {
    nu->used += loc.length;
    nu->tensors += 1;
  }
  return Status::ok();
}

Arena* RamTier::arena(uint64_t id) noexcept {
  auto it = arenas_.find(id);
  return it == arenas_.end() ? nullptr : it->second.arena.get();
}

void RamTier::forget_usage(Pool& pool, int32_t node, uint64_t bytes, uint64_t tensors) {
  pool.ram_used -= std::min(pool.ram_used, bytes);
  if (NodeUsage* nu = usage(node)) {
    nu->used -= std::min(nu->used, bytes);
    nu->tensors -= std::min(nu->tensors, tensors);
  }
}

void RamTier::drop_pool(uint64_t pool_id) {
  auto it = arenas_.lower_bound(arena_id(pool_id, 0));
  while (it != arenas_.end() && arena_pool(it->first) == pool_id) {
    (void)pins_.drop_arena(it->first);  // the object goes, and its pages with it
    if (NodeUsage* nu = usage(arena_node(it->first)))
      nu->pinned -= std::min(nu->pinned, it->second.pinned_free);
    if (Status st = it->second.arena->unlink(); !st) log_warn("{}", st.message());
    it = arenas_.erase(it);
    ++generation_;
  }
}

std::vector<std::pair<std::byte*, uint64_t>> RamTier::arena_spans() const {
  std::vector<std::pair<std::byte*, uint64_t>> out;
  for (const auto& [id, e] : arenas_)
    if (e.arena->committed() > 0) out.emplace_back(e.arena->base(), e.arena->committed());
  return out;
}

void RamTier::unlink_all() {
  for (auto& [id, e] : arenas_)
    if (Status st = e.arena->unlink(); !st) log_warn("{}", st.message());
}

}  // namespace tier::daemon
