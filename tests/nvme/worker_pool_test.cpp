// WorkerPool: every submitted job's result comes back once, stop() drains the queue, each
// result rings the eventfd, zero threads run inline, on_start runs once per worker.
#include <catch2/catch.hpp>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "nvme/worker_pool.hpp"

using tier::nvme::WorkerPool;

namespace {

struct EventFd {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~EventFd() { ::close(fd); }
  uint64_t count() const {
    uint64_t v = 0;
    return ::read(fd, &v, sizeof v) == sizeof v ? v : 0;
  }
};

}  // namespace

TEST_CASE("worker pool: stop() finishes every queued job; each result is taken once") {
  EventFd ev;
  REQUIRE(ev.fd >= 0);
  std::atomic<int> started{0};
  constexpr uint64_t kJobs = 2000;
  std::vector<uint64_t> got;
  {
    WorkerPool<uint64_t, uint64_t> pool(
        3, ev.fd, [](uint64_t& j) { return j * 3 + 1; }, [&] { started.fetch_add(1); });
    CHECK(pool.threads() == 3);
    for (uint64_t i = 0; i < kJobs; ++i) pool.submit(i);
    pool.stop();
    CHECK(pool.take(got) == kJobs);
    CHECK(pool.take(got) == 0);
  }
  CHECK(started.load() == 3);
  CHECK(ev.count() == kJobs);
  REQUIRE(got.size() == kJobs);
  std::sort(got.begin(), got.end());
  for (uint64_t i = 0; i < kJobs; ++i) CHECK(got[i] == i * 3 + 1);
}

TEST_CASE("worker pool: with zero threads a job runs inside submit()") {
  EventFd ev;
  REQUIRE(ev.fd >= 0);
  WorkerPool<int, int> pool(0, ev.fd, [](int& j) { return -j; });
  CHECK(pool.threads() == 0);
  pool.submit(7);
  std::vector<int> got;
  CHECK(pool.take(got) == 1);
  CHECK(got == std::vector<int>{-7});
  CHECK(ev.count() == 1);
}
