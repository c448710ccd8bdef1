// Engine: spill/fetch round trips, checksums, fallbacks, striping, errors that lose nothing,
// churn with every read verified, draining on shutdown, and re-adopting recorded locations.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "base/log.hpp"
#include "nvme/engine.hpp"
#include "nvme/fault_backend.hpp"
#include "wire/codec.hpp"
#include "test_util.hpp"

using namespace tier;
using namespace tier::nvme;
using namespace tier::nvme::testing;

namespace {

EngineOptions small_options(const std::vector<std::string>& dirs, uint64_t capacity = 64u << 20) {
  EngineOptions o;
  for (const auto& d : dirs) o.dirs.push_back({d, capacity, -1});
  o.file_size = 8u << 20;
  o.stripe_unit = 1u << 20;
  o.queue_depth = 8;
  o.request_size = 256u << 10;
  o.threads = 2;
  o.format = true;
  return o;
}

std::unique_ptr<Engine> open_engine(EngineOptions o) {
  auto e = Engine::open(std::move(o));
  if (!e) FAIL("Engine::open: " << e.error().to_string());
  return std::move(*e);
}

Result<NvmeLocation> spill(Engine& e, uint64_t id, std::span<const std::byte> src,
                           const NvmeLocation* replaces = nullptr) {
  std::optional<Result<NvmeLocation>> r;
  e.spill(id, src, [&](Result<NvmeLocation> x) { r = std::move(x); }, replaces);
  while (!r) e.wait();
  return std::move(*r);
}

Status fetch(Engine& e, const NvmeLocation& loc, std::span<std::byte> dst) {
  std::optional<Status> r;
  e.fetch(loc, dst, [&](Status s) { r = std::move(s); });
  while (!r) e.wait();
  return *r;
}

}  // namespace

TEST_CASE("engine: spill and fetch round trip on a disk directory (io_uring + O_DIRECT)") {
  TempDir dir;
  auto e = open_engine(small_options({dir.sub("nvme0")}));
  auto st = e->stats();
  REQUIRE(st.dirs.size() == 1);
  CHECK(st.dirs[0].backend == "io_uring");
  CHECK(st.dirs[0].direct_io);
  // aligned, unaligned length, unaligned address, tiny, larger than a data file
  for (auto [size, shift] : std::vector<std::pair<size_t, size_t>>{
           {1u << 20, 0}, {3 * 4096 + 17, 0}, {200000, 3}, {1, 0}, {9u << 20, 0}, {5000, 100}}) {
    Buffer src(size, shift), dst(size, shift);
    src.fill(size);
    auto loc = spill(*e, 1, src.cspan());
    REQUIRE(loc.has_value());
    CHECK(loc->size == size);
    uint64_t sum = 0;
    for (const Extent& x : loc->extents) {
      CHECK(x.offset % kExtentAlign == 0);
      sum += x.length;
    }
    CHECK(sum == size);
    REQUIRE(fetch(*e, *loc, dst.span()).is_ok());
    CHECK(std::memcmp(src.data(), dst.data(), size) == 0);
    REQUIRE(e->free(*loc).is_ok());
  }
  st = e->stats();
  CHECK(st.used == 0);
  CHECK(st.busy_s > 0);
  CHECK(e->measured_bandwidth() > 0);
  CHECK(st.dirs[0].bytes_written >= (1u << 20) + (9u << 20));
  CHECK(st.dirs[0].bytes_read >= (1u << 20) + (9u << 20));
}

TEST_CASE("engine: a flipped byte in a data file is reported as corruption, never as data") {
  TempDir dir;
  auto e = open_engine(small_options({dir.sub("nvme0")}));
  Buffer src(100000), dst(100000);
  src.fill(11);
  auto loc = spill(*e, 7, src.cspan());
  REQUIRE(loc.has_value());
  REQUIRE(loc->extents.size() == 1);
  const Extent& x = loc->extents[0];
  std::string path = e->file_path(x);
  {
    int fd = ::open(path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    std::byte b;
    REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(x.offset + 5000)) == 1);
    b ^= std::byte{0x01};
    REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(x.offset + 5000)) == 1);
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  Status s = fetch(*e, *loc, dst.span());
  CHECK(s.code() == Code::kCorruption);
  CHECK_THAT(s.message(), Catch::Contains("checksum mismatch in " + path) &&
                              Catch::Contains("at offset " + std::to_string(x.offset)));
  CHECK(e->stats().checksum_failures == 1);
}

TEST_CASE("engine: checksums computed inline (no hash threads) verify the same way") {
  TempDir dir;
  auto o = small_options({dir.sub("nvme0")});
  o.hash_threads = 0;
  o.max_extent = 64u << 10;  // many small extents, each with its own checksum
  auto e = open_engine(o);
  Buffer src(1000000), dst(1000000);
  src.fill(14);
  auto loc = spill(*e, 3, src.cspan());
  REQUIRE(loc.has_value());
  CHECK(loc->extents.size() == 16);
  for (const Extent& x : loc->extents) CHECK(x.length <= (64u << 10));
  REQUIRE(fetch(*e, *loc, dst.span()).is_ok());
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  // Corrupt the 6th extent only: the error names that extent.
  const Extent& x = loc->extents[5];
  int fd = ::open(e->file_path(x).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::byte b;
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(x.offset + x.length - 1)) == 1);
  b ^= std::byte{0x80};
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(x.offset + x.length - 1)) == 1);
  ::close(fd);
  Status s = fetch(*e, *loc, dst.span());
  CHECK(s.code() == Code::kCorruption);
  CHECK_THAT(s.message(), Catch::Contains("at offset " + std::to_string(x.offset)));
}

TEST_CASE("engine: a tmpfs directory falls back to the pread thread pool") {
  TempDir dir("/dev/shm");
  auto e = open_engine(small_options({dir.sub("nvme0")}));
  auto st = e->stats();
  CHECK(st.dirs[0].backend == "pread");
  CHECK_FALSE(st.dirs[0].direct_io);
  Buffer src(3u << 20, 1), dst(3u << 20, 2);
  src.fill(12);
  auto loc = spill(*e, 1, src.cspan());
  REQUIRE(loc.has_value());
  REQUIRE(fetch(*e, *loc, dst.span()).is_ok());
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
}

TEST_CASE("engine: tensors larger than the stripe unit are striped across directories") {
  TempDir dir;
  auto e = open_engine(small_options({dir.sub("a"), dir.sub("b")}));
  Buffer src((5u << 20) + 123), dst((5u << 20) + 123);
  src.fill(13);
  auto loc = spill(*e, 1, src.cspan());
  REQUIRE(loc.has_value());
  REQUIRE(loc->extents.size() == 6);
  for (size_t i = 1; i < loc->extents.size(); ++i)
    CHECK(loc->extents[i].dir != loc->extents[i - 1].dir);  // round-robin
  auto st = e->stats();
  CHECK(st.dirs[0].used > (2u << 20));
  CHECK(st.dirs[1].used > (2u << 20));
  REQUIRE(fetch(*e, *loc, dst.span()).is_ok());
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  // small tensors go to one directory
  Buffer small(4096);
  auto sloc = spill(*e, 2, small.cspan());
  REQUIRE(sloc.has_value());
  CHECK(sloc->extents.size() == 1);
}

TEST_CASE("engine: EIO and ENOSPC give clear errors and lose nothing already stored") {
  TempDir dir;
  FaultBackend* faults = nullptr;
  auto o = small_options({dir.sub("nvme0")});
  o.wrap_backend = [&](uint16_t, std::unique_ptr<IoBackend> b) -> std::unique_ptr<IoBackend> {
    auto f = make_fault_backend(std::move(b), {});
    REQUIRE(f);
    faults = f->get();
    return std::move(*f);
  };
  auto e = open_engine(std::move(o));
  REQUIRE(faults != nullptr);
  Buffer a(2u << 20), b(1u << 20), back(2u << 20);
  a.fill(21);
  b.fill(22);
  auto la = spill(*e, 1, a.cspan());
  REQUIRE(la.has_value());
  uint64_t used = e->stats().used;

  faults->set_rules({{FaultKind::kEio, IoOp::kWrite, 2, 0}});
  auto lb = spill(*e, 2, b.cspan());
  REQUIRE_FALSE(lb.has_value());
  CHECK(lb.error().code() == Code::kIo);
  CHECK_THAT(lb.error().message(), Catch::Contains("spill of tensor 2") &&
                                       Catch::Contains("data-000000.tier at offset") &&
                                       Catch::Contains("Input/output error"));
  CHECK(e->stats().used == used);  // the failed spill's extents were freed

  // Rewriting `a` fails with ENOSPC: its old copy stays where it was, intact.
  faults->set_rules({{FaultKind::kEnospc, IoOp::kWrite, 1, 0}});
  Buffer a2(2u << 20);
  a2.fill(23);
  auto la2 = spill(*e, 1, a2.cspan(), &*la);
  REQUIRE_FALSE(la2.has_value());
  CHECK(la2.error().code() == Code::kResourceExhausted);
  CHECK(e->stats().used == used);
  faults->set_rules({});
  REQUIRE(fetch(*e, *la, back.span()).is_ok());
  CHECK(std::memcmp(a.data(), back.data(), a.size()) == 0);

  // EIO on read: an error, not data.
  faults->set_rules({{FaultKind::kEio, IoOp::kRead, 1, 0}});
  Status s = fetch(*e, *la, back.span());
  CHECK(s.code() == Code::kIo);
  CHECK_THAT(s.message(), Catch::Contains("read "));
  faults->set_rules({});

  // A successful rewrite frees the old copy only now.
  auto la3 = spill(*e, 1, a2.cspan(), &*la);
  REQUIRE(la3.has_value());
  CHECK(e->stats().used == used);
  REQUIRE(fetch(*e, *la3, back.span()).is_ok());
  CHECK(std::memcmp(a2.data(), back.data(), a2.size()) == 0);
}

TEST_CASE("engine: a full tier refuses the spill and keeps what it stored") {
  TempDir dir;
  auto e = open_engine(small_options({dir.sub("nvme0")}, 16u << 20));
  CHECK(e->stats().capacity == (16u << 20));
  Buffer src(3u << 20);
  std::vector<NvmeLocation> kept;
  std::optional<Status> err;
  for (int i = 0; i < 10; ++i) {
    src.fill(100 + i);
    auto loc = spill(*e, i, src.cspan());
    if (!loc) {
      err = loc.error();
      break;
    }
    kept.push_back(*loc);
  }
  REQUIRE(err.has_value());
  CHECK(err->code() == Code::kResourceExhausted);
  CHECK_THAT(err->message(), Catch::Contains("full"));
  CHECK(kept.size() == 5);
  Buffer back(3u << 20);
  for (size_t i = 0; i < kept.size(); ++i) {
    src.fill(100 + i);
    REQUIRE(fetch(*e, kept[i], back.span()).is_ok());
    CHECK(std::memcmp(src.data(), back.data(), src.size()) == 0);
  }
}

TEST_CASE("engine: content integrity under churn, every read checked against a hash") {
  TempDir dir;
  FaultBackend* faults = nullptr;
  auto o = small_options({dir.sub("a"), dir.sub("b")}, 24u << 20);
  o.wrap_backend = [&](uint16_t d, std::unique_ptr<IoBackend> b) -> std::unique_ptr<IoBackend> {
    // short transfers and EAGAIN on the first directory, to churn through the retry paths too
    std::vector<FaultRule> rules;
    if (d == 0)
      rules = {{FaultKind::kShort, std::nullopt, 0, 0.1}, {FaultKind::kEagain, std::nullopt, 0, 0.1}};
    auto f = make_fault_backend(std::move(b), rules, 5);
    REQUIRE(f);
    if (d == 0) faults = f->get();
    return std::move(*f);
  };
  auto e = open_engine(std::move(o));
  struct Stored {
    NvmeLocation loc;
    uint64_t hash;
  };
  std::map<uint64_t, Stored> stored;
  std::mt19937_64 g(1234);
  uint64_t checked = 0, full = 0;
  for (int step = 0; step < 400; ++step) {
    uint64_t id = g() % 24;
    int action = static_cast<int>(g() % 3);
    auto it = stored.find(id);
    if (action == 0 || it == stored.end()) {  // write (or rewrite) with a random size
      size_t size = 1 + g() % (3u << 20);
      Buffer src(size, g() % 2 ? 0 : g() % 4096);
      src.fill(g());
      auto loc = spill(*e, id, src.cspan(), it != stored.end() ? &it->second.loc : nullptr);
      if (!loc) {
        REQUIRE(loc.error().code() == Code::kResourceExhausted);
        ++full;
        continue;
      }
      stored[id] = {*loc, XXH3_64bits(src.data(), size)};
    } else if (action == 1) {  // read and verify
      Buffer dst(it->second.loc.size, g() % 2 ? 0 : 7);
      REQUIRE(fetch(*e, it->second.loc, dst.span()).is_ok());
      REQUIRE(XXH3_64bits(dst.data(), dst.size()) == it->second.hash);
      ++checked;
    } else {
      REQUIRE(e->free(it->second.loc).is_ok());
      stored.erase(it);
    }
  }
  for (auto& [id, s] : stored) {
    Buffer dst(s.loc.size);
    REQUIRE(fetch(*e, s.loc, dst.span()).is_ok());
    REQUIRE(XXH3_64bits(dst.data(), dst.size()) == s.hash);
    ++checked;
    REQUIRE(e->free(s.loc).is_ok());
  }
  CHECK(checked > 80);
  CHECK(e->stats().used == 0);
  CHECK(faults->fired(FaultKind::kShort) > 0);
  INFO("spills refused as full: " << full);
}

TEST_CASE("engine: destruction drains I/O in flight and runs every callback") {
  TempDir dir;
  Buffer src(8u << 20);
  src.fill(31);
  int ok = 0;
  std::vector<NvmeLocation> locs;
  {
    auto e = open_engine(small_options({dir.sub("nvme0")}));
    for (int i = 0; i < 8; ++i)
      e->spill(i, src.cspan().subspan(size_t(i) << 20, 1u << 20), [&](Result<NvmeLocation> r) {
        REQUIRE(r.has_value());
        locs.push_back(*r);
        ++ok;
      });
    CHECK(e->pending() == 8);
  }
  CHECK(ok == 8);
  // The data reached the files: reopen without formatting, adopt and read back.
  auto o = small_options({dir.sub("nvme0")});
  o.format = false;
  auto e = open_engine(o);
  Buffer back(1u << 20);
  for (size_t i = 0; i < locs.size(); ++i) {
    REQUIRE(e->adopt(locs[i]).is_ok());
    REQUIRE(fetch(*e, locs[i], back.span()).is_ok());
    CHECK(std::memcmp(src.data() + (i << 20), back.data(), back.size()) == 0);
  }
  CHECK(e->stats().used == 8u << 20);
  // New space never overlaps adopted extents; adopting twice is refused.
  CHECK_FALSE(e->adopt(locs[0]).is_ok());
  auto fresh = spill(*e, 99, back.cspan());
  REQUIRE(fresh.has_value());
  for (const NvmeLocation& l : locs)
    for (const Extent& a : l.extents)
      for (const Extent& b : fresh->extents)
        CHECK((a.file != b.file || a.offset + allocated_bytes(a) <= b.offset ||
               b.offset + allocated_bytes(b) <= a.offset));
}

TEST_CASE("engine: registered arenas round trip; bad locations are refused") {
  TempDir dir;
  auto e = open_engine(small_options({dir.sub("nvme0")}));
  Buffer arena(4u << 20);
  MemRegion r{arena.data(), arena.size()};
  bool reg = e->register_memory({&r, 1});
  if (!reg) WARN("fixed buffers were not registered here (RLIMIT_MEMLOCK?)");
  CHECK(e->stats().dirs[0].registered_buffers == reg);
  arena.fill(41);
  auto loc = spill(*e, 1, arena.cspan().subspan(0, 2u << 20));
  REQUIRE(loc.has_value());
  REQUIRE(fetch(*e, *loc, arena.span().subspan(2u << 20, 2u << 20)).is_ok());
  CHECK(std::memcmp(arena.data(), arena.data() + (2u << 20), 2u << 20) == 0);
  Buffer wrong(100);
  CHECK(fetch(*e, *loc, wrong.span()).code() == Code::kInvalidArgument);
  NvmeLocation bogus = *loc;
  bogus.extents[0].file = 77;
  CHECK(fetch(*e, bogus, arena.span().subspan(0, 2u << 20)).code() == Code::kInvalidArgument);
}

TEST_CASE("locations round trip through the wire codec and malformed ones are refused") {
  NvmeLocation loc;
  loc.size = 3 * 4096 + 5;
  loc.extents = {{1, 7, 8192, 4096, 0x1234}, {0, 2, 0, 2 * 4096 + 5, 0xfeed}};
  CHECK(well_formed(loc));
  std::vector<std::byte> buf;
  tier::wire::Writer w(buf);
  w(loc);
  NvmeLocation back;
  tier::wire::Reader r(buf);
  r(back);
  CHECK(r.ok());
  CHECK(r.at_end());
  CHECK(back == loc);
  NvmeLocation bad = loc;
  bad.size += 1;
  CHECK_FALSE(well_formed(bad));
  bad = loc;
  bad.extents[0].offset = 100;
  CHECK_FALSE(well_formed(bad));
  TempDir dir;
  auto e = open_engine(small_options({dir.sub("nvme0")}));
  CHECK(e->adopt(bad).code() == Code::kInvalidArgument);
}

TEST_CASE("engine: the pread backend on a disk keeps O_DIRECT, bouncing unaligned buffers") {
  TempDir dir;
  auto o = small_options({dir.sub("nvme0")});
  o.backend = BackendChoice::kPread;  // as when io_uring is unavailable
  auto e = open_engine(o);
  auto st = e->stats();
  CHECK(st.dirs[0].backend == "pread");
  CHECK(st.dirs[0].direct_io);
  for (auto [size, shift] : std::vector<std::pair<size_t, size_t>>{{(1u << 20) + 3, 0}, {77777, 9}}) {
    Buffer src(size, shift), dst(size, shift + 1);
    src.fill(size);
    auto loc = spill(*e, 5, src.cspan());
    REQUIRE(loc.has_value());
    REQUIRE(fetch(*e, *loc, dst.span()).is_ok());
    CHECK(std::memcmp(src.data(), dst.data(), size) == 0);
  }
}

TEST_CASE("engine: its lines go through tierd's logger, named nvme and at their level") {
  struct Line {
    tier::LogLevel level;
    std::string text;
  };
  std::mutex mu;
  std::vector<Line> lines;
  tier::set_log_sink([&](tier::LogLevel l, std::string_view t) {
    std::lock_guard lk(mu);
    lines.push_back({l, std::string(t)});
  });
  {
    TempDir dir;
    auto o = small_options({dir.sub("nvme0")});
    o.backend = BackendChoice::kPread;
    auto e = open_engine(o);
  }
  tier::set_log_sink({});
  std::lock_guard lk(mu);
  auto it = std::find_if(lines.begin(), lines.end(), [](const Line& l) {
    return l.text.find("using the pread/pwrite thread pool") != std::string::npos;
  });
  REQUIRE(it != lines.end());
  CHECK(it->level == tier::LogLevel::kWarning);
  CHECK(it->text.rfind("nvme: NVMe directory ", 0) == 0);
}
