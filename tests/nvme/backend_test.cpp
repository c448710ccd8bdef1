// Backends and IoQueue: round trips, resubmission of short transfers and -EAGAIN, errors,
// the eventfd contract and draining on shutdown.
#include <catch2/catch.hpp>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "nvme/fault_backend.hpp"
#include "nvme/io_backend.hpp"
#include "nvme/io_queue.hpp"
#include "test_util.hpp"

using namespace tier::nvme;
using tier::nvme::testing::Buffer;
using tier::nvme::testing::TempDir;

namespace {

constexpr size_t kFileBytes = 8u << 20;

int open_direct(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) REQUIRE(::fallocate(fd, 0, 0, kFileBytes) == 0);
  return fd;
}

std::unique_ptr<IoBackend> uring(uint32_t qd = 8) {
  auto b = make_uring_backend({qd, 1, -1});
  REQUIRE(b.has_value());
  return std::move(*b);
}

// Runs one transfer to completion; returns its result.
int64_t run(IoQueue& q, IoOp op, int file, uint64_t off, std::byte* buf, uint64_t len) {
  bool done = false;
  int64_t res = 0;
  q.submit(op, file, off, buf, len, [&](int64_t r) {
    done = true;
    res = r;
  });
  while (!done) q.wait();
  return res;
}

}  // namespace

TEST_CASE("io_uring backend: write then read back through O_DIRECT, eventfd signals") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  IoQueue q(uring(4), {256u << 10, 100});
  CHECK(q.backend().name() == "io_uring");
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer src(4u << 20), dst(4u << 20);
  src.fill(1);
  bool done = false;
  q.submit(IoOp::kWrite, *idx, 4096, src.data(), src.size(), [&](int64_t r) {
    CHECK(r == static_cast<int64_t>(src.size()));
    done = true;
  });
  CHECK(wait_readable(q.event_fd(), 10000));  // completions announce themselves on the eventfd
  while (!done) q.wait();
  CHECK(q.counters().requests == 16);  // 4 MiB in 256 KiB requests
  CHECK(run(q, IoOp::kRead, *idx, 4096, dst.data(), dst.size()) == static_cast<int64_t>(dst.size()));
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  q.drain();
  ::close(fd);
}

TEST_CASE("io_uring backend: registered buffers are used when registration succeeds") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  Buffer src(1u << 20), dst(1u << 20);
  src.fill(2);
  IoQueue q(uring(4), {});
  MemRegion regions[] = {{src.data(), src.size()}, {dst.data(), dst.size()}};
  bool registered = q.backend().register_memory(regions);
  if (!registered) WARN("fixed buffers could not be registered here; unregistered path tested");
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  CHECK(run(q, IoOp::kWrite, *idx, 0, src.data(), src.size()) == (1 << 20));
  CHECK(run(q, IoOp::kRead, *idx, 0, dst.data(), dst.size()) == (1 << 20));
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  // Unregistering (an empty set) leaves plain I/O working on the same buffers.
  CHECK_FALSE(q.backend().register_memory({}));
  src.fill(3);
  CHECK(run(q, IoOp::kWrite, *idx, 0, src.data(), src.size()) == (1 << 20));
  CHECK(run(q, IoOp::kRead, *idx, 0, dst.data(), dst.size()) == (1 << 20));
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  ::close(fd);
}

TEST_CASE("IoQueue: short transfers and -EAGAIN are resubmitted until complete") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  auto fb = make_fault_backend(
      uring(8), {{FaultKind::kShort, std::nullopt, 0, 0.4}, {FaultKind::kEagain, std::nullopt, 0, 0.3}}, 99);
  REQUIRE(fb);
  FaultBackend* faults = fb->get();
  IoQueue q(std::move(*fb), {1u << 20, 1000});
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer src(8u << 20), dst(8u << 20);
  src.fill(3);
  CHECK(run(q, IoOp::kWrite, *idx, 0, src.data(), src.size()) == (8 << 20));
  CHECK(run(q, IoOp::kRead, *idx, 0, dst.data(), dst.size()) == (8 << 20));
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  CHECK(faults->fired(FaultKind::kShort) > 0);
  CHECK(faults->fired(FaultKind::kEagain) > 0);
  CHECK(q.counters().short_retries == faults->fired(FaultKind::kShort));
  CHECK(q.counters().eagain_retries == faults->fired(FaultKind::kEagain));
  ::close(fd);
}

TEST_CASE("IoQueue: an injected EIO fails only its transfer, after its other requests finish") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  auto fb = make_fault_backend(uring(8), {{FaultKind::kEio, IoOp::kWrite, 3, 0}});
  REQUIRE(fb);
  IoQueue q(std::move(*fb), {1u << 20, 10});
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer a(4u << 20), b(1u << 20);
  a.fill(4);
  b.fill(5);
  int64_t ra = 1, rb = 1;
  int done = 0;
  q.submit(IoOp::kWrite, *idx, 0, a.data(), a.size(), [&](int64_t r) { ra = r, ++done; });
  q.submit(IoOp::kWrite, *idx, 4u << 20, b.data(), b.size(), [&](int64_t r) { rb = r, ++done; });
  while (done < 2) q.wait();
  CHECK(ra == -EIO);  // its third request failed
  CHECK(rb == static_cast<int64_t>(b.size()));
  CHECK(q.backend().in_flight() == 0);
  ::close(fd);
}

TEST_CASE("IoQueue: -EAGAIN forever gives up after max_retries with -EAGAIN") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  auto fb = make_fault_backend(uring(4), {{FaultKind::kEagain, std::nullopt, 0, 1.0}});
  REQUIRE(fb);
  IoQueue q(std::move(*fb), {1u << 20, 5});
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer a(8192);
  CHECK(run(q, IoOp::kWrite, *idx, 0, a.data(), a.size()) == -EAGAIN);
  CHECK(q.counters().eagain_retries == 5);
  ::close(fd);
}

TEST_CASE("pread thread pool backend: same contract, reads past the end are errors") {
  TempDir dir("/dev/shm");
  int fd = ::open(dir.sub("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 1 << 20) == 0);
  auto b = make_thread_pool_backend({8, 3, -1});
  REQUIRE(b);
  IoQueue q(std::move(*b), {64u << 10, 10});
  CHECK(q.backend().name() == "pread");
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer src(1000 * 1000, 3), dst(1000 * 1000, 5);  // unaligned memory and length are fine here
  src.fill(6);
  CHECK(run(q, IoOp::kWrite, *idx, 17, src.data(), src.size()) == 1000 * 1000);
  CHECK(run(q, IoOp::kRead, *idx, 17, dst.data(), dst.size()) == 1000 * 1000);
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  Buffer past(4096);
  CHECK(run(q, IoOp::kRead, *idx, 1 << 20, past.data(), past.size()) == -EIO);
  ::close(fd);
}

TEST_CASE("FaultBackend: delayed completions arrive through the eventfd") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  FaultRule delay{FaultKind::kDelay, std::nullopt, 1, 0, 30};
  auto fb = make_fault_backend(uring(4), {delay});
  REQUIRE(fb);
  FaultBackend* faults = fb->get();
  IoQueue q(std::move(*fb), {});
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer a(64 << 10);
  bool done = false;
  q.submit(IoOp::kWrite, *idx, 0, a.data(), a.size(), [&](int64_t r) {
    CHECK(r == (64 << 10));
    done = true;
  });
  // Block on the eventfd only, as the daemon's epoll loop would.
  for (int i = 0; i < 100 && !done; ++i) {
    if (wait_readable(q.event_fd(), 1000)) q.poll();
  }
  CHECK(done);
  CHECK(faults->fired(FaultKind::kDelay) == 1);
  ::close(fd);
}

TEST_CASE("IoQueue: destruction drains every transfer in flight") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  Buffer a(8u << 20);
  a.fill(7);
  int completed = 0;
  {
    auto fb = make_fault_backend(uring(4), {{FaultKind::kDelay, std::nullopt, 0, 0.5, 5}});
    REQUIRE(fb);
    IoQueue q(std::move(*fb), {256u << 10, 10});
    auto idx = q.backend().add_file(fd);
    REQUIRE(idx);
    for (int i = 0; i < 8; ++i)
      q.submit(IoOp::kWrite, *idx, uint64_t(i) << 20, a.data() + (size_t(i) << 20), 1u << 20, [&](int64_t r) {
        CHECK(r == (1 << 20));
        ++completed;
      });
    CHECK(q.pending_transfers() == 8);
  }
  CHECK(completed == 8);
  Buffer back(8u << 20);
  REQUIRE(::pread(fd, back.data(), back.size(), 0) == static_cast<ssize_t>(back.size()));
  CHECK(std::memcmp(a.data(), back.data(), a.size()) == 0);
  ::close(fd);
}

TEST_CASE("io_uring backend: more submissions than ring slots never fail") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  auto b = uring(4);  // 4 SQ slots, 8 CQ slots; 64 operations submitted without reaping
  auto idx = b->add_file(fd);
  REQUIRE(idx);
  Buffer src(64 * 65536);
  src.fill(8);
  for (uint64_t i = 0; i < 64; ++i)
    b->submit({IoOp::kWrite, *idx, i * 65536, src.data() + i * 65536, 65536, i});
  b->flush();
  std::vector<IoCompletion> got;
  for (int spins = 0; got.size() < 64 && spins < 1000; ++spins) {
    wait_readable(b->event_fd(), 100);
    b->reap(got);
  }
  REQUIRE(got.size() == 64);
  std::vector<bool> seen(64, false);
  for (const IoCompletion& c : got) {
    CHECK(c.result == 65536);
    REQUIRE(c.user_data < 64);
    CHECK_FALSE(seen[c.user_data]);
    seen[c.user_data] = true;
  }
  CHECK(b->in_flight() == 0);
  Buffer back(64 * 65536);
  REQUIRE(::pread(fd, back.data(), back.size(), 0) == static_cast<ssize_t>(back.size()));
  CHECK(std::memcmp(src.data(), back.data(), src.size()) == 0);
  ::close(fd);
}
