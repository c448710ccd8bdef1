#include "client/arena_map.hpp"

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
  arenas_.clear();
}

Result<const Arena*> ArenaMap::add(uint64_t id, int fd, uint64_t size, int32_t numa_node) {
  struct CloseFd {
    int fd;
    ~CloseFd() { if (fd >= 0) ::close(fd); }
  } guard{fd};
  if (fd < 0) return fail(Code::kProtocol, "tierd sent no file descriptor for arena " + std::to_string(id));
  if (size == 0) return fail(Code::kProtocol, "tierd reported arena " + std::to_string(id) + " of size 0");
  // The file must really be as large as announced, or touching the tail would SIGBUS.
  struct stat st{};
  if (::fstat(fd, &st) != 0) return fail(Status::from_errno(errno, "fstat of arena " + std::to_string(id)));
  if (static_cast<uint64_t>(st.st_size) < size)
    return fail(Code::kProtocol, "arena " + std::to_string(id) + " is " + std::to_string(st.st_size) +
                                     " bytes, smaller than the " + std::to_string(size) +
                                     " tierd announced");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return fail(Status::from_errno(errno, "mmap of arena " + std::to_string(id) + " (" +
                                              std::to_string(size) + " bytes)"));
  arenas_.push_back(Arena{id, static_cast<std::byte*>(p), size, numa_node});
  return &arenas_.back();
}

}  // namespace tier::client
