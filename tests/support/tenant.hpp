// Helpers of the daemon tests that act as a tenant: a second uid (65534), a private /dev/shm,
// a raw connection and a lease's bytes through MapArena. Header-only (the REQUIREs are Catch2's);
// single-threaded, like the tests that use them.
#pragma once

#include <catch2/catch.hpp>
#include <grp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"

namespace tier::test {

// A fresh tmpfs of `size` on /dev/shm in this process's own mount + IPC namespace (entered on
// first use): a reboot as far as shared memory goes.
inline void fresh_shm(const char* size = "1g") {
  static bool entered = false;
  if (!entered) {
    REQUIRE(::unshare(CLONE_NEWNS | CLONE_NEWIPC) == 0);
    REQUIRE(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0);
    entered = true;
  } else {
    (void)::umount2("/dev/shm", MNT_DETACH);
  }
  std::string opts = std::string("mode=1777,size=") + size;
  REQUIRE(::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) == 0);
}

// Runs `fn` in a child as uid/gid 65534; its return value is the child's exit code (-1 when the
// child did not exit normally, e.g. killed by SIGBUS, which is printed).
inline int as_nobody(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(100);
    _exit(fn());
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) std::cerr << "the tenant died of signal " << WTERMSIG(st) << "\n";
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

inline RawClient must_connect(const TestDaemon& d) {
  auto c = RawClient::connect(d.socket());
  REQUIRE(c);
  return std::move(*c);
}

// Leases tensor `id`, maps its arena through MapArena and fills (write) or checks (read) every
// byte against `pattern`. Returns 0 when it matched/was written, else a non-zero step code.
inline int access_tensor(RawClient& c, uint64_t id, bool write, unsigned char pattern) {
  using namespace tier::wire;
  auto l = c.lease(write ? LeaseMode::kWrite : LeaseMode::kRead, {id}, 5000);
  if (!l || l->grants.size() != 1) return 1;
  const LeaseGrant& g = l->grants[0];
  int fd = -1;
  auto m = c.call<MapArenaRep>(MsgType::kMapArena, MapArenaReq{g.arena_id}, &fd);
  if (!m || fd < 0) return 2;
  void* p = ::mmap(nullptr, m->size, write ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return 3;
  auto* b = static_cast<unsigned char*>(p) + g.offset;
  int rc = 0;
  if (write) std::memset(b, pattern, g.length);
  else
    for (uint64_t i = 0; i < g.length && rc == 0; ++i)
      if (b[i] != pattern) rc = 4;
  ::munmap(p, m->size);
  if (!c.release({g.lease_id})) return 5;
  return rc;
}

}  // namespace tier::test
