// Holder liveness for write leases across a restart (daemon/leases/reclaim.hpp): a live process
// mapping the arena writable is alive, a reaped or reused pid or an unmapped arena is gone, a
// pid of another namespace is unknown.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "leases/reclaim.hpp"

using namespace tier::daemon;

namespace {
struct ShmObject {
  std::string name = "/tierd-lease-reclaim-test-" + std::to_string(::getpid());
  int fd = -1;
  struct stat sb{};
  ShmObject() {
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 1 << 20) == 0);
    REQUIRE(::fstat(fd, &sb) == 0);
  }
  ~ShmObject() {
    ::close(fd);
    ::shm_unlink(name.c_str());
  }
};
}  // namespace

TEST_CASE("a write lease's holder is alive while it maps the arena, gone once not") {
  ShmObject obj;
  const LeaseHolder me{::getuid(), ::getpid(), process_start_time(::getpid()), own_pid_ns()};
  REQUIRE(me.pid_start != 0);
  REQUIRE(me.pid_ns != 0);
  CHECK(holder_liveness(me, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kGone);  // not mapped
  void* p = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, obj.fd, 0);
  REQUIRE(p != MAP_FAILED);
  CHECK(holder_liveness(me, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kAlive);
  LeaseHolder reused = me;
  reused.pid_start += 1;  // the pid now names a process started at another time
  CHECK(holder_liveness(reused, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kGone);
  LeaseHolder elsewhere = me;
  elsewhere.pid_ns += 1;  // seen from another pid namespace: the pid means nothing here
  CHECK(holder_liveness(elsewhere, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kUnknown);
  LeaseHolder invisible = me;
  invisible.pid = 0;
  CHECK(holder_liveness(invisible, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kUnknown);
  // Read-only: it cannot store into the arena.
  REQUIRE(::munmap(p, 1 << 20) == 0);
  p = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, obj.fd, 0);
  REQUIRE(p != MAP_FAILED);
  CHECK(holder_liveness(me, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kGone);
  ::munmap(p, 1 << 20);

  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    _exit(0);
  }
  LeaseHolder kid{::getuid(), child, process_start_time(child), own_pid_ns()};
  CHECK(kid.pid_start != 0);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(holder_liveness(kid, obj.sb.st_dev, obj.sb.st_ino) == Liveness::kGone);  // exited
}
