#include "daemon/ram/ram_tier.hpp"

#include <cstring>

#include "daemon/log.hpp"
#include "wire/errors.hpp"
#include "wire/sizes.hpp"

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

Result<RamLocation> RamTier::allocate(Pool& pool, int32_t node, uint64_t size, bool packed) {
  NodeUsage* nu = usage(node);
  if (!nu) return fail(Code::kInvalidArgument, "NUMA node " + std::to_string(node) + " has no RAM tier");
  uint64_t gran = ExtentAllocator::kGranule;
  uint64_t align = size >= opts_.alignment ? opts_.alignment : gran;
  uint64_t need = ExtentAllocator::round_up(size, gran);
  if (need < size) return fail(Code::kInvalidArgument, "tensor size overflows");
  if (pool.ram_used + need > pool.ram_quota)
    return fail(Code::kResourceExhausted,
                "pool '" + pool.name + "' RAM quota of " + format_size(pool.ram_quota) + " reached (used " +
                    format_size(pool.ram_used) + ", need " + format_size(need) + ")");
  if (nu->used + need > nu->capacity)
    return fail(Code::kResourceExhausted, "RAM tier of NUMA node " + std::to_string(node) + " is full (" +
                                              format_size(nu->used) + " of " + format_size(nu->capacity) +
                                              " used, need " + format_size(need) + ")");
  uint64_t id = arena_id(pool.id, node);
  auto it = arenas_.find(id);
  if (it == arenas_.end()) {
    ArenaSpec spec{opts_.prefix,   pool.id, node, pool.ram_quota, opts_.hugepages, opts_.hugetlbfs_mount,
                   opts_.prefault, {},      0};
    auto a = Arena::create(spec);
    if (!a) return fail(a.error());
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
  pool.ram_used += need;
  nu->used += need;
  nu->tensors += 1;
  return RamLocation{id, node, *off, need};
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
  if (offset >= loc.offset || !alloc.free(loc.offset, loc.length))
    return fail(Code::kInvalidArgument, "move: bad range");
  if (!alloc.reserve(offset, loc.length)) {
    (void)alloc.reserve(loc.offset, loc.length);  // just freed: cannot fail
    return fail(Code::kInvalidArgument, "move: the range below is not free");
  }
  std::byte* base = it->second.arena->base();
  std::memmove(base + offset, base + loc.offset, loc.length);
  RamLocation moved = loc;
  moved.offset = offset;
  return moved;
}

void RamTier::release(Pool& pool, const RamLocation& loc) {
  auto it = arenas_.find(loc.arena_id);
  if (it == arenas_.end() || !it->second.alloc.free(loc.offset, loc.length)) {
    log_error("internal: release of an unknown extent (arena {}, offset {}, {} bytes)", loc.arena_id,
              loc.offset, loc.length);
    return;
  }
  pool.ram_used -= std::min(pool.ram_used, loc.length);
  if (NodeUsage* nu = usage(loc.node)) {
    nu->used -= std::min(nu->used, loc.length);
    nu->tensors -= nu->tensors > 0 ? 1 : 0;
  }
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
  if (!a) return fail(a.error());
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
