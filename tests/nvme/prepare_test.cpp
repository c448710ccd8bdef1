// FilePreparer through the engine: new data files are written once before use (no unwritten
// extents for spills to convert), one file ahead; an interrupted preparation never becomes a
// data file.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "nvme/engine.hpp"
#include "test_util.hpp"

using namespace tier;
using namespace tier::nvme;
using namespace tier::nvme::testing;

namespace {

EngineOptions prep_options(const std::string& dir, uint64_t file_size, uint64_t capacity) {
  EngineOptions o;
  o.dirs.push_back({dir, capacity, -1});
  o.file_size = file_size;
  o.queue_depth = 8;
  o.request_size = 256u << 10;
  o.format = true;
  return o;
}

// Bytes of `path` in unwritten extents (FIEMAP), or nullopt when the filesystem cannot say.
std::optional<uint64_t> unwritten_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  constexpr unsigned kMax = 512;
  std::vector<char> mem(sizeof(fiemap) + kMax * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(mem.data());
  fm->fm_start = 0;
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  ::close(fd);
  if (rc != 0) return std::nullopt;
  uint64_t n = 0;
  for (unsigned i = 0; i < fm->fm_mapped_extents; ++i)
    if (fm->fm_extents[i].fe_flags & FIEMAP_EXTENT_UNWRITTEN) n += fm->fm_extents[i].fe_length;
  return n;
}

bool spill_ok(Engine& e, std::span<const std::byte> src) {
  std::optional<bool> ok;
  e.spill(1, src, [&](Result<NvmeLocation> r) { ok = r.has_value(); });
  while (!ok) e.wait();
  return *ok;
}

}  // namespace

TEST_CASE("engine: new data files are written before use, one file ahead; without preparation they are not") {
  TempDir dir;
  const std::string d = dir.sub("nvme0");
  const std::string f0 = d + "/data-000000.tier", f1 = d + "/data-000001.tier";
  {
    // Without preparation (as before): fallocate'd only, so a filesystem with unwritten
    // extents reports the whole file unwritten. This is what the check below must not see.
    EngineOptions o = prep_options(d, 8u << 20, 32u << 20);
    o.prepare_files = false;
    auto e = Engine::open(o);
    REQUIRE(e.has_value());
    if (!(*e)->stats().dirs[0].direct_io) {
      WARN("skipped: " << d << " has no O_DIRECT (files are not prepared there)");
      return;
    }
    Buffer src(4096);
    REQUIRE(spill_ok(**e, src.cspan()));
    auto u = unwritten_bytes(f0);
    if (!u || *u == 0) {
      WARN("skipped: the filesystem under " << d << " does not report unwritten extents");
      return;
    }
    CHECK(*u > (4u << 20));
  }
  auto e = Engine::open(prep_options(d, 8u << 20, 32u << 20));  // format: files removed
  REQUIRE(e.has_value());
  (*e)->wait_prepared();
  CHECK(std::filesystem::exists(f0));  // prepared at open, before any spill
  CHECK(!std::filesystem::exists(f1));
  CHECK(unwritten_bytes(f0) == std::optional<uint64_t>(0));
  CHECK(std::filesystem::file_size(f0) == (8u << 20));
  Buffer src(4096);
  src.fill(3);
  REQUIRE(spill_ok(**e, src.cspan()));  // takes file 0; file 1 is prepared next, while idle
  (*e)->wait_prepared();
  CHECK(std::filesystem::exists(f1));
  CHECK(unwritten_bytes(f1) == std::optional<uint64_t>(0));
  CHECK((*e)->stats().dirs[0].prepared_bytes == (16u << 20));
  CHECK((*e)->stats().dirs[0].file_bytes == (8u << 20));  // file 1 is not in use yet
}

TEST_CASE("engine: a leftover .prep file is removed at open, and stopping mid-preparation leaves none") {
  TempDir dir;
  const std::string d = dir.sub("nvme0");
  std::filesystem::create_directories(d);
  {
    std::ofstream junk(d + "/data-000000.tier.prep");
    junk << "a preparation cut short by a crash";
  }
  {
    auto e = Engine::open(prep_options(d, 8u << 20, 32u << 20));
    REQUIRE(e.has_value());
    (*e)->wait_prepared();
    CHECK(!std::filesystem::exists(d + "/data-000000.tier.prep"));
    Buffer src(100000), dst(100000);
    src.fill(7);
    std::optional<Result<NvmeLocation>> r;
    (*e)->spill(1, src.cspan(), [&](Result<NvmeLocation> x) { r = std::move(x); });
    while (!r) (*e)->wait();
    REQUIRE(r->has_value());
    std::optional<Status> f;
    (*e)->fetch(**r, dst.span(), [&](const Status& s) { f = s; });
    while (!f) (*e)->wait();
    CHECK(f->is_ok());
    CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  }
  // A large file is still being written when the engine goes away: the destructor stops it.
  {
    auto e = Engine::open(prep_options(d, 512u << 20, 1u << 30));
    REQUIRE(e.has_value());
  }
  for (const auto& entry : std::filesystem::directory_iterator(d)) CHECK(entry.path().extension() != ".prep");
}
