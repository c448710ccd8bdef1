// Durability of NVMe copies: the sync operation of every backend, the FaultBackend's model of a
// volatile write cache (what a power loss forgets), and the engine's promise that a spill is
// reported only once its copy would survive a power loss, with one fdatasync per data file
// shared by the spills of a batch (group commit).
#include <catch2/catch.hpp>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "nvme/engine.hpp"
#include "nvme/fault_backend.hpp"
#include "nvme/io_queue.hpp"
#include "test_util.hpp"

using namespace tier;
using namespace tier::nvme;
using namespace tier::nvme::testing;

namespace {

constexpr size_t kFileBytes = 8u << 20;
constexpr uint32_t k64K = 64u << 10;

int open_direct(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) REQUIRE(::fallocate(fd, 0, 0, kFileBytes) == 0);
  return fd;
}

std::unique_ptr<FaultBackend> fault_uring(std::vector<FaultRule> rules = {}) {
  auto b = make_uring_backend({8, 1, -1});
  REQUIRE(b.has_value());
  auto f = make_fault_backend(std::move(*b), std::move(rules));
  REQUIRE(f.has_value());
  return std::move(*f);
}

int64_t run(IoQueue& q, IoOp op, int file, uint64_t off, std::byte* buf, uint64_t len) {
  std::optional<int64_t> res;
  q.submit(op, file, off, buf, len, [&](int64_t r) { res = r; });
  while (!res) q.wait();
  return *res;
}

// Polls `e` until `done()` holds; false after 10 s.
bool pump(Engine& e, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    e.poll();
    if (!done()) wait_readable(e.event_fd(), 10);
  }
  return true;
}

bool all_zero(const std::byte* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

EngineOptions options(const std::vector<std::string>& dirs) {
  EngineOptions o;
  for (const auto& d : dirs) o.dirs.push_back({d, 32u << 20, -1});
  o.file_size = 8u << 20;
  o.stripe_unit = 1u << 20;
  o.queue_depth = 8;
  o.request_size = 256u << 10;
  o.hash_threads = 0;  // hashed inside spill(): a spill waits only for its I/O
  o.format = true;
  return o;
}

// An engine whose directories each sit behind a FaultBackend (io_uring + O_DIRECT inside).
struct FaultyEngine {
  std::vector<FaultBackend*> faults;
  std::unique_ptr<Engine> e;

  explicit FaultyEngine(EngineOptions o) {
    o.wrap_backend = [this](uint16_t, std::unique_ptr<IoBackend> b) -> std::unique_ptr<IoBackend> {
      auto f = make_fault_backend(std::move(b), {});
      REQUIRE(f);
      faults.push_back(f->get());
      return std::move(*f);
    };
    auto opened = Engine::open(std::move(o));
    if (!opened) FAIL("Engine::open: " << opened.error().to_string());
    e = std::move(*opened);
  }
  void set_rules(const std::vector<FaultRule>& r) {
    for (FaultBackend* f : faults) f->set_rules(r);
  }
  size_t holding() const {
    size_t n = 0;
    for (FaultBackend* f : faults) n += f->holding();
    return n;
  }
  void release_held() {
    for (FaultBackend* f : faults) f->release_held();
  }
  uint64_t syncs() const {
    uint64_t n = 0;
    for (const DirStats& d : e->stats().dirs) n += d.syncs;
    return n;
  }
  uint64_t bytes_written() const {
    uint64_t n = 0;
    for (const DirStats& d : e->stats().dirs) n += d.bytes_written;
    return n;
  }
};

// Spills whose results the test collects: `reported` holds what the engine called done.
struct Spills {
  std::map<uint64_t, Result<NvmeLocation>> reported;
  bool powered = true;  // results reported after a power loss describe a dead machine

  void start(Engine& e, uint64_t id, std::span<const std::byte> src, const NvmeLocation* replaces = nullptr) {
    e.spill(
        id, src,
        [this, id](Result<NvmeLocation> r) {
          if (powered) reported.emplace(id, std::move(r));
        },
        replaces);
  }
};

}  // namespace

TEST_CASE("sync: io_uring and pread backends fdatasync through IoQueue, EAGAIN resubmitted") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  Buffer a(k64K);
  a.fill(1);
  for (bool uring : {true, false}) {
    auto inner = uring ? make_uring_backend({4, 1, -1}) : make_thread_pool_backend({4, 2, -1});
    REQUIRE(inner);
    auto fb = make_fault_backend(std::move(*inner), {{FaultKind::kEagain, IoOp::kSync, 1, 0}});
    REQUIRE(fb);
    FaultBackend* faults = fb->get();
    IoQueue q(std::move(*fb), {});
    auto idx = q.backend().add_file(fd);
    REQUIRE(idx);
    CHECK(run(q, IoOp::kWrite, *idx, 0, a.data(), a.size()) == k64K);
    CHECK(run(q, IoOp::kSync, *idx, 0, nullptr, 0) == 0);
    CHECK(faults->fired(FaultKind::kEagain) == 1);
    CHECK(q.counters().eagain_retries == 1);
    CHECK(q.counters().syncs == 1);
    CHECK(faults->volatile_bytes() == 0);
    faults->set_rules({{FaultKind::kEio, IoOp::kSync, 1, 0}});
    CHECK(run(q, IoOp::kWrite, *idx, k64K, a.data(), a.size()) == k64K);
    CHECK(run(q, IoOp::kSync, *idx, 0, nullptr, 0) == -EIO);
    CHECK(q.counters().syncs == 1);
    CHECK(faults->volatile_bytes() == k64K);  // a failed sync makes nothing durable
  }
  ::close(fd);
}

TEST_CASE("FaultBackend: a power loss forgets exactly the writes no reported sync covered") {
  TempDir dir;
  int fd = open_direct(dir.sub("f"));
  REQUIRE(fd >= 0);
  auto fb = fault_uring();
  FaultBackend* faults = fb.get();
  IoQueue q(std::move(fb), {});
  auto idx = q.backend().add_file(fd);
  REQUIRE(idx);
  Buffer x(k64K), y(k64K), z(k64K), v(k64K), back(5 * k64K);
  x.fill(1), y.fill(2), z.fill(3), v.fill(4);

  // x: written, then a sync submitted after its completion: durable.
  REQUIRE(run(q, IoOp::kWrite, *idx, 0, x.data(), k64K) == k64K);
  REQUIRE(run(q, IoOp::kSync, *idx, 0, nullptr, 0) == 0);
  // z: its sync was submitted while z was still in flight, so it does not cover z.
  std::optional<int64_t> rz, rs;
  q.submit(IoOp::kWrite, *idx, 2 * k64K, z.data(), k64K, [&](int64_t r) { rz = r; });
  q.submit(IoOp::kSync, *idx, 0, nullptr, 0, [&](int64_t r) { rs = r; });
  while (!rz || !rs) q.wait();
  REQUIRE(*rz == k64K);
  REQUIRE(*rs == 0);
  // y: written after the last sync that completed.
  REQUIRE(run(q, IoOp::kWrite, *idx, k64K, y.data(), k64K) == k64K);
  // v: written, its sync completed in the device but was not reported yet: not durable.
  REQUIRE(run(q, IoOp::kWrite, *idx, 3 * k64K, v.data(), k64K) == k64K);
  faults->set_rules({{FaultKind::kHold, IoOp::kSync, 0, 1.0}});
  std::optional<int64_t> rv;
  q.submit(IoOp::kSync, *idx, 0, nullptr, 0, [&](int64_t r) { rv = r; });
  for (int i = 0; i < 1000 && faults->holding() == 0; ++i) {
    wait_readable(q.event_fd(), 10);
    q.poll();
  }
  REQUIRE(faults->holding() == 1);
  CHECK(faults->volatile_bytes() == 3 * k64K);

  auto lost = faults->power_loss();
  REQUIRE(lost);
  CHECK(*lost == 3 * k64K);
  CHECK(faults->powered_off());
  q.drain();
  CHECK(rv == -EIO);                                               // the held sync never made it
  CHECK(run(q, IoOp::kRead, *idx, 0, back.data(), k64K) == -EIO);  // the device is off

  REQUIRE(::pread(fd, back.data(), 5 * k64K, 0) == static_cast<ssize_t>(5 * k64K));
  CHECK(std::memcmp(back.data(), x.data(), k64K) == 0);
  CHECK(all_zero(back.data() + k64K, 3 * k64K));
  ::close(fd);
}

TEST_CASE("engine: a spill is reported only once durable, and a power loss keeps every reported copy") {
  TempDir dir;
  auto o = options({dir.sub("a"), dir.sub("b")});
  std::vector<Buffer> src;
  for (size_t size : {300000ul, 3ul << 20, 4096ul, 1ul << 20, 2500000ul, 70000ul, 5ul << 20, 123ul})
    src.emplace_back(size, src.size() % 2 ? 0 : 512);
  for (size_t i = 0; i < src.size(); ++i) src[i].fill(40 + i);
  const size_t half = src.size() / 2;
  std::map<uint64_t, NvmeLocation> durable;
  {
    FaultyEngine fe(o);
    Spills s;
    // First half: spilled and reported, with nothing held.
    for (size_t i = 0; i < half; ++i) s.start(*fe.e, i, src[i].cspan());
    REQUIRE(pump(*fe.e, [&] { return s.reported.size() == half; }));
    // Second half: every sync held, so these copies are written but not yet durable.
    fe.set_rules({{FaultKind::kHold, IoOp::kSync, 0, 1.0}});
    for (size_t i = half; i < src.size(); ++i) s.start(*fe.e, i, src[i].cspan());
    REQUIRE(pump(*fe.e, [&] { return fe.holding() > 0 || s.reported.size() == src.size(); }));
    CHECK(s.reported.size() == half);  // nothing is reported before its sync

    s.powered = false;
    uint64_t lost = 0;
    for (FaultBackend* f : fe.faults) {
      auto l = f->power_loss();
      REQUIRE(l);
      lost += *l;
    }
    CHECK(lost > 0);  // the second half's writes were in the volatile cache
    for (auto& [id, r] : s.reported) {
      REQUIRE(r.has_value());
      durable.emplace(id, *r);
    }
  }  // the engine drains: what was not reported fails against the dead device

  // "Reboot": a fresh engine on the same files adopts every reported copy and reads it back.
  o.format = false;
  auto opened = Engine::open(o);
  REQUIRE(opened);
  Engine& e = **opened;
  REQUIRE_FALSE(durable.empty());
  for (auto& [id, loc] : durable) {
    INFO("tensor " << id << ", " << loc.size << " bytes");
    REQUIRE(e.adopt(loc).is_ok());
    Buffer dst(loc.size);
    std::optional<Status> r;
    e.fetch(loc, dst.span(), [&](const Status& st) { r = st; });
    while (!r) e.wait();
    CHECK(r->is_ok());
    CHECK(XXH3_64bits(dst.data(), dst.size()) == XXH3_64bits(src[id].data(), src[id].size()));
  }
}

TEST_CASE("engine: spills whose writes complete together share one fdatasync per file") {
  TempDir dir;
  FaultyEngine fe(options({dir.sub("a")}));
  Spills s;
  std::vector<Buffer> src;
  for (int i = 0; i < 6; ++i) {
    src.emplace_back(k64K);
    src.back().fill(60 + i);
  }
  // Six spills of one request each; their completions are held and then reported in one poll.
  fe.set_rules({{FaultKind::kHold, IoOp::kWrite, 0, 1.0}});
  for (int i = 0; i < 6; ++i) s.start(*fe.e, i, src[i].cspan());
  REQUIRE(pump(*fe.e, [&] { return fe.holding() == 6; }));
  fe.set_rules({});
  fe.release_held();
  REQUIRE(pump(*fe.e, [&] { return s.reported.size() == 6; }));
  CHECK(fe.syncs() == 1);
  CHECK(fe.faults[0]->volatile_bytes() == 0);

  // Spills whose writes complete while a sync is in flight wait for the next one, together.
  fe.set_rules({{FaultKind::kHold, IoOp::kSync, 0, 1.0}});
  s.start(*fe.e, 10, src[0].cspan());
  REQUIRE(pump(*fe.e, [&] { return fe.holding() == 1; }));
  uint64_t written = fe.bytes_written();
  s.start(*fe.e, 11, src[1].cspan());
  s.start(*fe.e, 12, src[2].cspan());
  REQUIRE(pump(*fe.e, [&] { return fe.bytes_written() == written + 2 * k64K; }));
  fe.e->poll();
  CHECK(s.reported.size() == 6);  // 10 waits for its held sync, 11 and 12 for the next
  CHECK(fe.holding() == 1);       // and that next one is not issued while one is in flight
  fe.set_rules({});
  fe.release_held();
  REQUIRE(pump(*fe.e, [&] { return s.reported.size() == 9; }));
  CHECK(fe.syncs() == 3);
  for (auto& [id, r] : s.reported) CHECK(r.has_value());
  CHECK(fe.faults[0]->volatile_bytes() == 0);
}

TEST_CASE("engine: a failed fdatasync fails the spill, frees its extents, keeps the replaced copy") {
  TempDir dir;
  FaultyEngine fe(options({dir.sub("a")}));
  Spills s;
  Buffer a(1u << 20), a2(1u << 20), back(1u << 20);
  a.fill(70);
  a2.fill(71);
  s.start(*fe.e, 1, a.cspan());
  REQUIRE(pump(*fe.e, [&] { return s.reported.size() == 1; }));
  REQUIRE(s.reported.at(1).has_value());
  NvmeLocation la = *s.reported.at(1);
  uint64_t used = fe.e->stats().used;

  fe.set_rules({{FaultKind::kEio, IoOp::kSync, 1, 0}});
  s.reported.clear();
  s.start(*fe.e, 1, a2.cspan(), &la);
  REQUIRE(pump(*fe.e, [&] { return s.reported.size() == 1; }));
  const Result<NvmeLocation>& r = s.reported.at(1);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == Code::kIo);
  CHECK_THAT(r.error().message(), Catch::Contains("spill of tensor 1") && Catch::Contains("fdatasync") &&
                                      Catch::Contains("data-000000.tier"));
  CHECK(fe.e->stats().used == used);  // the new extents were freed, the old copy kept
  fe.set_rules({});
  std::optional<Status> f;
  fe.e->fetch(la, back.span(), [&](const Status& st) { f = st; });
  REQUIRE(pump(*fe.e, [&] { return f.has_value(); }));
  CHECK(f->is_ok());
  CHECK(std::memcmp(a.data(), back.data(), a.size()) == 0);
}

// Write-behind flush (EngineOptions::flush_behind_bytes): a 4 MiB spill of 16 requests whose last
// write is held back. With a 1 MiB interval the engine issues an fdatasync on its own while that
// write is outstanding; the spill is still reported only after a sync issued after its last write.
TEST_CASE(
    "engine: a long spill gets write-behind fdatasyncs while it streams, and is reported once durable") {
  TempDir dir;
  EngineOptions o = options({dir.sub("a")});
  const uint64_t interval = GENERATE(uint64_t{0}, uint64_t{1} << 20);
  o.flush_behind_bytes = interval;
  FaultyEngine fe(o);
  Spills s;
  Buffer a(4u << 20);
  a.fill(80);
  const uint64_t requests = a.size() / o.request_size;
  fe.set_rules({{FaultKind::kHold, IoOp::kWrite, requests, 0}});
  s.start(*fe.e, 1, a.cspan());
  REQUIRE(pump(*fe.e, [&] { return fe.holding() == 1 && fe.bytes_written() == a.size() - o.request_size; }));
  // Let any write-behind sync complete while the last write is still held back.
  REQUIRE(pump(*fe.e, [&] { return fe.syncs() == fe.e->stats().behind_syncs; }));
  fe.e->poll();
  CHECK(s.reported.empty());
  if (interval == 0) {
    CHECK(fe.e->stats().behind_syncs == 0);
  } else {
    CHECK(fe.e->stats().behind_syncs >= 1);
    CHECK(fe.syncs() >= 1);
    CHECK(fe.faults[0]->volatile_bytes() < a.size() - o.request_size);  // the burst is persisting
  }
  fe.set_rules({});
  fe.release_held();
  REQUIRE(pump(*fe.e, [&] { return s.reported.size() == 1; }));
  REQUIRE(s.reported.at(1).has_value());
  CHECK(fe.syncs() == fe.e->stats().behind_syncs + 1);  // and one the spill waited for
  CHECK(fe.faults[0]->volatile_bytes() == 0);
  // A power loss right after the report forgets nothing.
  auto lost = fe.faults[0]->power_loss();
  REQUIRE(lost.has_value());
  CHECK(*lost == 0);
}

// A failed fdatasync may have consumed the write-back error of any write to its file that
// completed before it, including writes of a spill that was not waiting on it (a write-behind
// sync covers no spill): that spill must fail, or a later sync would report its lost bytes durable.
TEST_CASE("engine: a failed write-behind fdatasync fails the spill still writing to that file") {
  TempDir dir;
  EngineOptions o = options({dir.sub("a")});
  o.flush_behind_bytes = 1u << 20;
  FaultyEngine fe(o);
  Spills s;
  Buffer a(4u << 20);
  a.fill(81);
  uint64_t used = fe.e->stats().used;
  const uint64_t requests = a.size() / o.request_size;
  fe.set_rules({{FaultKind::kHold, IoOp::kWrite, requests, 0}, {FaultKind::kEio, IoOp::kSync, 1, 0}});
  s.start(*fe.e, 1, a.cspan());
  REQUIRE(pump(*fe.e, [&] { return fe.holding() == 1 && fe.e->stats().io_errors == 1; }));
  CHECK(s.reported.empty());  // its last write is still held back
  fe.set_rules({});
  fe.release_held();
  REQUIRE(pump(*fe.e, [&] { return s.reported.size() == 1; }));
  const Result<NvmeLocation>& r = s.reported.at(1);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == Code::kIo);
  CHECK_THAT(r.error().message(), Catch::Contains("spill of tensor 1") && Catch::Contains("fdatasync"));
  CHECK(fe.e->stats().used == used);  // its extents were freed
  CHECK(fe.e->stats().behind_syncs >= 1);
}
