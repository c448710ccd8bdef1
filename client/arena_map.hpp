// The arenas a Client has mapped: arena id -> base address of a MAP_SHARED mapping of the whole
// arena, made once per connection from the fd tierd passes with a MapArena reply.
//
// Ownership: the table owns its mappings and unmaps them on destruction; every lease span points
// into one of them, so the table must outlive the Client's leases (it lives as long as the
// Client). Thread-safety: none; the Client's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tier/status.hpp"

namespace tier::client {

struct Arena {
  uint64_t id = 0;
  std::byte* base = nullptr;
  uint64_t size = 0;
  int32_t numa_node = -1;
  uint64_t dev = 0, ino = 0;  // the shared-memory object (a restarted tierd passes the same one)
  bool read_only = false;     // mapped PROT_READ (the fd was read-only: a group reader)
};

class ArenaMap {
 public:
  ArenaMap() = default;
  ~ArenaMap();
  ArenaMap(const ArenaMap&) = delete;
  ArenaMap& operator=(const ArenaMap&) = delete;

  // Linear search: a client maps one arena per (pool, NUMA node) it touches, a handful at most,
  // which beats hashing on the lease hot path.
  const Arena* find(uint64_t id) const noexcept {
    for (const Arena& a : arenas_)
      if (a.id == id) return &a;
    return nullptr;
  }
  // Maps `fd` (size bytes, read-write, shared) as arena `id`. Takes ownership of fd: it is
  // closed whether or not the mapping succeeds (the mapping keeps the memory alive).
  [[nodiscard]] Result<const Arena*> add(uint64_t id, int fd, uint64_t size, int32_t numa_node);
  // After tierd restarted: whether `fd` is the very object mapped as arena `id` (same device and
  // inode), so the mapping (and every span into it) is still the arena. Does not take fd.
  [[nodiscard]] bool same_object(uint64_t id, int fd) const noexcept;
  // Maps `fd` as arena `id` in place of the current mapping (the object was replaced: a reboot
  // or a dropped and re-created pool). The old mapping stays until unmap_all(), so spans that
  // still point into it never fault. Takes ownership of fd like add().
  [[nodiscard]] Result<const Arena*> replace(uint64_t id, int fd, uint64_t size, int32_t numa_node);
  const std::vector<Arena>& all() const noexcept { return arenas_; }
  void unmap_all() noexcept;

 private:
  [[nodiscard]] Result<Arena> map(uint64_t id, int fd, uint64_t size, int32_t numa_node);
  std::vector<Arena> arenas_;
  std::vector<Arena> retired_;
};

}  // namespace tier::client
