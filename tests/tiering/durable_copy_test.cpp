// The daemon's tiering layer journals an NVMe copy only once the copy is durable: the request
// handler over a real DaemonState with its journal, an NVMe directory whose backend is wrapped
// in a FaultBackend (the engine hook), driven synchronously. The order the journal sees is
// write -> fdatasync -> NvmeCopyWritten, and after a simulated power loss every extent the
// journal names reads back with its checksum.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/daemon.hpp"
#include "durability/durability.hpp"
#include "journal/format.hpp"
#include "journal/journal.hpp"
#include "journal/reader.hpp"
#include "nvme/engine.hpp"
#include "nvme/fault_backend.hpp"
#include "nvme/test_util.hpp"
#include "support/handler_harness.hpp"

using namespace tier;
using namespace tier::daemon;
using namespace tier::wire;

namespace {

// The NvmeCopyWritten records the journal in `state_dir` holds for `tensor`, read from disk.
std::vector<journal::NvmeCopyWritten> copies_journaled(const std::string& state_dir, uint64_t tensor) {
  std::string path = state_dir + "/journal/" + std::string(journal::Journal::kFileName);
  std::vector<journal::NvmeCopyWritten> out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  auto bytes = journal::read_whole_file(fd, path);
  ::close(fd);
  REQUIRE(bytes);
  auto scanned =
      journal::scan(*bytes, journal::kJournalMagic, [&](const journal::Record& r, uint64_t, size_t) {
        if (const auto* w = std::get_if<journal::NvmeCopyWritten>(&r); w && w->tensor_id == tensor)
          out.push_back(*w);
        return Status::ok();
      });
  REQUIRE(scanned);
  return out;
}

// Wraps the backend of every engine opened while it lives in a FaultBackend; restores the hook.
struct WrapNvmeBackends {
  std::vector<nvme::FaultBackend*> faults;
  WrapNvmeBackends() {
    nvme::set_default_wrap_backend(
        [this](uint16_t, std::unique_ptr<nvme::IoBackend> b) -> std::unique_ptr<nvme::IoBackend> {
          auto f = nvme::make_fault_backend(std::move(b), {});
          REQUIRE(f);
          faults.push_back(f->get());
          return std::move(*f);
        });
  }
  ~WrapNvmeBackends() { nvme::set_default_wrap_backend({}); }
};

Config nvme_config(const std::string& nvme) {
  Config cfg;
  cfg.topology = "synthetic:pack:1 numa:1 core:1 pu:1";
  cfg.nvme.push_back(NvmeDir{nvme, -1});
  return cfg;
}

}  // namespace

TEST_CASE("a write-back is journaled after its writes and their fdatasync, and survives a power loss") {
  const uint64_t kRam = 32ull << 20, kSize = 3ull << 20;
  tier::nvme::testing::TempDir nvme;  // outlives the daemon state
  REQUIRE_FALSE(nvme.path().empty());
  WrapNvmeBackends wrap;
  tier::test::HandlerHarness h(nvme_config(nvme.path()), ResolvedSizes{kRam, kRam, 2ull << 20});
  REQUIRE(wrap.faults.size() == 1);
  nvme::FaultBackend& faults = *wrap.faults[0];
  // The journal, as tierd's main() opens it.
  REQUIRE(open_durability(*h.state).is_ok());
  REQUIRE(h.state->tiering->adopt_catalog());

  auto s = h.session(::getuid(), true);
  REQUIRE(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"p", kRam, 0, false}));
  auto t =
      h.call<TensorInfoW>(*s, MsgType::kTensorCreate, TensorCreateReq{"p", "t", kSize, 0, {}, 0, -1, false});
  REQUIRE(t);
  auto l = h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{2, -1, {t->id}});
  REQUIRE(l);
  std::vector<std::byte> bytes(kSize);
  for (size_t i = 0; i < kSize; ++i) bytes[i] = std::byte((i * 131 + i / 4096) & 0xff);
  std::memcpy(h.at(l->grants[0]), bytes.data(), kSize);
  REQUIRE(h.call<Empty>(*s, MsgType::kRelease, ReleaseReq{{l->grants[0].lease_id}}));

  // Each write and sync completion as the engine sees it, with the copies journaled by then.
  struct Event {
    nvme::IoOp op;
    int32_t result;
    size_t journaled;
  };
  std::vector<Event> events;
  faults.set_observer([&](nvme::IoOp op, const nvme::IoCompletion& c) {
    events.push_back({op, c.result, copies_journaled(h.dir, t->id).size()});
  });
  REQUIRE(h.call<Empty>(*s, MsgType::kEvict, TensorIdsReq{"p", {t->id}}));  // the write-back
  faults.set_observer({});
  auto copies = copies_journaled(h.dir, t->id);
  REQUIRE(copies.size() == 1);

  size_t last_write = 0, writes = 0, syncs_after = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    INFO("event " << i << " op " << int(events[i].op) << " result " << events[i].result);
    CHECK(events[i].result >= 0);
    CHECK(events[i].journaled == 0);  // nothing journaled before its writes and sync completed
    if (events[i].op == nvme::IoOp::kWrite) last_write = i, ++writes;
  }
  for (size_t i = last_write + 1; i < events.size(); ++i) syncs_after += events[i].op == nvme::IoOp::kSync;
  CHECK(writes >= 3);       // 3 MiB in 1 MiB requests
  CHECK(syncs_after >= 1);  // write -> sync -> NvmeCopyWritten

  // Power loss right after the record: nothing the journal names may be forgotten.
  CHECK(faults.volatile_bytes() == 0);
  auto lost = faults.power_loss();
  REQUIRE(lost);
  CHECK(*lost == 0);
  uint64_t covered = 0;
  for (const journal::Extent& e : copies[0].extents) {
    REQUIRE(e.dir == "0");
    char name[32];
    std::snprintf(name, sizeof name, "/data-%06lu.tier", std::stoul(e.file));
    std::string file = nvme.path() + name;
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    std::vector<std::byte> got(e.length);
    CHECK(::pread(fd, got.data(), got.size(), static_cast<off_t>(e.offset)) ==
          static_cast<ssize_t>(e.length));
    ::close(fd);
    CHECK(XXH3_64bits(got.data(), got.size()) == e.checksum);
    CHECK(std::memcmp(got.data(), bytes.data() + covered, e.length) == 0);
    covered += e.length;
  }
  CHECK(covered == kSize);
  h.handler->session_closed(*s);
}
