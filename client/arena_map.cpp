#include "client/arena_map.hpp"
#include "base/errors.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace tier::client {

ArenaMap::~ArenaMap() { unmap_all(); }

void ArenaMap::unmap_all() noexcept {
  for (Arena& a : arenas_)
    if (a.base) ::munmap(a.base, a.size);
  for (Arena& a : retired_)
    if (a.base) ::munmap(a.base, a.size);
  arenas_.clear();
  retired_.clear();
}

bool ArenaMap::same_object(uint64_t id, int fd) const noexcept {
  const Arena* a = find(id);
  struct stat st{};
  if (!a || fd < 0 || ::fstat(fd, &st) != 0) return false;
  return a->dev == static_cast<uint64_t>(st.st_dev) && a->ino == static_cast<uint64_t>(st.st_ino);
}

Result<const Arena*> ArenaMap::add(uint64_t id, int fd, uint64_t size, int32_t numa_node) {
  auto a = map(id, fd, size, numa_node);
  TIER_TRY(a);
  arenas_.push_back(*a);
  return &arenas_.back();
}

Result<const Arena*> ArenaMap::replace(uint64_t id, int fd, uint64_t size, int32_t numa_node) {
  auto a = map(id, fd, size, numa_node);
  TIER_TRY(a);
  for (Arena& old : arenas_)
    if (old.id == id) {
      retired_.push_back(old);
      old = *a;
      return &old;
    }
  arenas_.push_back(*a);
  return &arenas_.back();
}

Result<Arena> ArenaMap::map(uint64_t id, int fd, uint64_t size, int32_t numa_node) {
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd >= 0) ::close(fd);
    }
  } guard{fd};
  if (fd < 0) return fail(Code::kProtocol, "tierd sent no file descriptor for arena " + std::to_string(id));
  if (size == 0) return fail(Code::kProtocol, "tierd reported arena " + std::to_string(id) + " of size 0");
  // `size` is the arena's reservation; the object may be shorter: tierd grows it as it places
  // extents, always before it leases a span in the new part, so a lease never touches a page
  // past the object's end. A larger object than announced is not tierd's arena.
  struct stat st{};
  if (::fstat(fd, &st) != 0) return fail(Status::from_errno(errno, "fstat of arena " + std::to_string(id)));
  if (static_cast<uint64_t>(st.st_size) > size)
    return fail(Code::kProtocol, "arena " + std::to_string(id) + " is " + std::to_string(st.st_size) +
                                     " bytes, larger than the " + std::to_string(size) + " tierd announced");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  // A group reader gets a read-only fd (daemon/leases/access.hpp): map it read-only.
  bool read_only = false;
  if (p == MAP_FAILED && errno == EACCES) {
    p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    read_only = true;
  }
  if (p == MAP_FAILED)
    return fail(Status::from_errno(
        errno, "mmap of arena " + std::to_string(id) + " (" + std::to_string(size) + " bytes)"));
  return Arena{id,        static_cast<std::byte*>(p),       size,
               numa_node, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
               read_only};
}

}  // namespace tier::client
