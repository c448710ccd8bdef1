// NvmeTier alone (daemon/tiering/): no socket, no request handler, no journal. A catalog, a RAM
// tier and an NVMe directory whose backend is a FaultBackend (the engine's wrap hook); the test
// places tensors, writes their bytes and drives evictions, failed write-backs and fetches
// itself, polling the tier for completions.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ram/arena.hpp"
#include "daemon/daemon.hpp"
#include "nvme/engine.hpp"
#include "nvme/fault_backend.hpp"
#include "nvme/test_util.hpp"

using namespace tier;
using namespace tier::daemon;

namespace {

// A DaemonState with an NVMe tier over `nvme`, every directory's backend wrapped in a
// FaultBackend (kept in `fault`). Removes its arenas and state directory at the end.
struct Tier {
  std::string dir;
  nvme::FaultBackend* fault = nullptr;
  std::unique_ptr<DaemonState> st;

  explicit Tier(const std::string& nvme, uint64_t ram) {
    REQUIRE_FALSE(nvme.empty());
    char tmpl[] = "/tmp/tierd-nvme-tier.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    nvme::set_default_wrap_backend(
        [this](uint16_t, std::unique_ptr<nvme::IoBackend> b) -> std::unique_ptr<nvme::IoBackend> {
          auto f = nvme::make_fault_backend(std::move(b), {});
          REQUIRE(f);
          fault = f->get();
          return std::move(*f);
        });
    Config cfg;
    cfg.state_dir = dir;
    cfg.topology = "synthetic:pack:1 numa:1 core:1 pu:1";
    cfg.nvme.push_back(NvmeDir{nvme, -1});
    auto s = make_state(std::move(cfg), ResolvedSizes{ram, ram, 2ull << 20});
    nvme::set_default_wrap_backend({});
    REQUIRE(s);
    st = std::move(*s);
    REQUIRE(st->tiering);
    REQUIRE(fault);
  }
  ~Tier() {
    std::string prefix = arena_prefix(dir);
    st.reset();
    remove_arenas(prefix);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  NvmeTier& tier() { return *st->tiering; }
  // A pool with a 16 MiB RAM quota.
  Pool& pool(const std::string& name) {
    auto p = st->catalog.create_pool(name, 0, 16ull << 20, 0);
    REQUIRE(p);
    return **p;
  }

  // A tensor of `size` bytes in RAM, its bytes `fill`, dirty as after a write lease.
  Tensor& put(Pool& p, const std::string& name, uint64_t size, std::byte fill) {
    auto loc = tier().allocate(p, 0, size);
    REQUIRE(loc);
    auto t = st->catalog.create_tensor(p, TensorDesc{name, size, DType::kBytes, {}, {}}, 0);
    REQUIRE(t);
    (*t)->ram = *loc;
    Tensor* one = *t;
    tier().on_granted(std::span<Tensor* const>(&one, 1), LeaseMode::kWrite);
    std::memset(bytes(**t), static_cast<int>(fill), size);
    return **t;
  }
  std::byte* bytes(const Tensor& t) {
    Arena* a = st->ram->arena(t.ram->arena_id);
    REQUIRE(a);
    return a->base() + t.ram->offset;
  }
  // Polls the tier until `tensors` are all in RAM for a read lease (at most ~10 s).
  void lease_read(uint64_t session, std::vector<Tensor*> tensors) {
    auto wait = tier().prepare_lease(session, tensors, LeaseMode::kRead);
    REQUIRE(wait);
    bool ready = !*wait;
    for (int i = 0; i < 10000 && !ready; ++i) {
      tier().poll();
      REQUIRE(tier().lease_ready(tensors, ready).is_ok());
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(ready);
  }
};

bool all_bytes(const std::byte* p, uint64_t n, std::byte v) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

}  // namespace

TEST_CASE(
    "a failed write-back keeps the tensor in RAM, dirty, and says why, and once the device works it leaves "
    "and comes back intact") {
  nvme::testing::TempDir nvme;
  Tier t(nvme.path(), 64ull << 20);
  Pool& p = t.pool("p");
  Tensor& a = t.put(p, "a", 1 << 20, std::byte{0x5a});
  Tensor& b = t.put(p, "b", 1 << 20, std::byte{0xa5});

  // The first write the device sees fails.
  t.fault->set_rules({nvme::FaultRule{nvme::FaultKind::kEio, nvme::IoOp::kWrite, 1}});
  Tensor* both[] = {&a, &b};
  size_t skipped = 0;
  Status st = t.tier().evict(p, both, skipped);
  CHECK(st.code() == Code::kIo);
  CHECK(st.message().find("stays in RAM") != std::string::npos);
  CHECK(t.fault->fired(nvme::FaultKind::kEio) == 1);
  // Exactly one of the two failed: it is still in RAM, dirty, with its bytes; the other left.
  Tensor* failed = a.ram ? &a : &b;
  Tensor* left = a.ram ? &b : &a;
  REQUIRE(failed->ram);
  CHECK(failed->dirty);
  CHECK_FALSE(failed->nvme);
  CHECK(all_bytes(t.bytes(*failed), failed->size, failed == &a ? std::byte{0x5a} : std::byte{0xa5}));
  CHECK_FALSE(left->ram);
  REQUIRE(left->nvme);
  CHECK(t.tier().stats().writeback_errors == 1);

  // The device works again: the write-back goes through once its back-off (1 s) has passed.
  t.fault->set_rules({});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  Tensor* one[] = {failed};
  REQUIRE(t.tier().evict(p, one, skipped).is_ok());
  CHECK_FALSE(failed->ram);
  REQUIRE(failed->nvme);

  // Both come back for a read lease, bit-exact; the figures count the bytes.
  t.lease_read(7, {&a, &b});
  REQUIRE(a.ram);
  REQUIRE(b.ram);
  CHECK(all_bytes(t.bytes(a), a.size, std::byte{0x5a}));
  CHECK(all_bytes(t.bytes(b), b.size, std::byte{0xa5}));
  const NvmeTier::Figures f = t.tier().figures();
  CHECK(f.bytes_written >= 2 * (1 << 20));
  CHECK(f.bytes_read >= 2 * (1 << 20));
  REQUIRE(f.dirs.size() == 1);
  CHECK(f.dirs[0].path == nvme.path());
  CHECK(f.dirty_by_node.empty());  // both clean: their NVMe copies equal their RAM copies
  CHECK(t.tier().stats().fetches == 2);
}

TEST_CASE("a fetch that reads torn bytes fails the lease with kCorruption and never serves them") {
  nvme::testing::TempDir nvme;
  Tier t(nvme.path(), 64ull << 20);
  Pool& p = t.pool("q");
  Tensor& a = t.put(p, "a", 1 << 20, std::byte{0x11});
  Tensor* one[] = {&a};
  size_t skipped = 0;
  REQUIRE(t.tier().evict(p, one, skipped).is_ok());
  REQUIRE(a.nvme);
  // Damage the copy on the device: one byte of its first extent.
  const auto& x = a.nvme->extents.front();
  {
    const std::string path = t.tier().engine().file_path(x);
    FILE* f = std::fopen(path.c_str(), "r+b");
    REQUIRE(f);
    REQUIRE(std::fseek(f, static_cast<long>(x.offset + 4096), SEEK_SET) == 0);
    std::fputc(0x22, f);
    std::fclose(f);
  }
  auto wait = t.tier().prepare_lease(9, one, LeaseMode::kRead);
  REQUIRE(wait);
  REQUIRE(*wait);
  Status st;
  bool ready = false;
  for (int i = 0; i < 10000 && st.is_ok() && !ready; ++i) {
    t.tier().poll();
    st = t.tier().lease_ready(one, ready);
    if (st.is_ok() && !ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(st.code() == Code::kCorruption);
  CHECK_FALSE(ready);
  CHECK(t.tier().stats().fetch_errors == 1);
}
