// Registered arenas on a GPU: an H2D after evict + refetch copies the arena's current bytes
// (tierd keeps the pages of registered ranges, daemon/tiering/ram/dma_pins.hpp), and a group reader's
// read-only mapping is registered with cudaHostRegisterReadOnly, so its copies are direct.
// Without a device every case prints "no CUDA device: skipping" and returns.
#include <cuda_runtime_api.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gpu_support.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"
#include "tier/gpu.hpp"

namespace {

void fill(std::span<std::byte> b, unsigned seed) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte((i * 31 + seed) % 251);
}

std::vector<std::byte> device_bytes(const void* dev, size_t n) {
  std::vector<std::byte> v(n);
  REQUIRE(cudaMemcpy(v.data(), dev, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}

}  // namespace

TEST_CASE("an H2D after evict and refetch copies the arena's current bytes", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  char tmpl[] = "/tmp/gpu-arena-pin.XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string nvme = tmpl;
  tier::test::DaemonOptions dopts;
  dopts.ram = "64M";
  dopts.extra_args = {"--remove-arenas-on-exit", "--nvme-dir",
                      nvme};  // sparse arenas: evicted extents are punched
  {
    tier::test::TestDaemon daemon(dopts);
    auto client = tier::Client::connect(daemon.socket());
    REQUIRE(client.has_value());
    auto& c = **client;
    REQUIRE(c.create_pool("gpu", {}, true).has_value());
    const size_t n = 4u << 20;
    auto t = c.create_tensor("gpu", {.name = "t", .size = n, .shape = {}, .placement = {}});
    REQUIRE(t.has_value());
    {
      auto w = c.lease(t->id, tier::LeaseMode::kWrite);
      REQUIRE(w.has_value());
      fill(w->bytes(), 1);
      REQUIRE(w->release().is_ok());
    }
    auto st = tier::gpu::Stager::create(c);  // registers on demand: nothing yet
    REQUIRE(st.has_value());
    void* dev = nullptr;
    REQUIRE(cudaMalloc(&dev, n) == cudaSuccess);
    // One copy before the evict registers the tensor's granules (after pinning them in tierd),
    // so the evict below meets registered pages: without it nothing would be registered yet and
    // the test would pass even if tierd ignored the pin.
    {
      auto r0 = c.lease(t->id, tier::LeaseMode::kRead);
      REQUIRE(r0.has_value());
      auto first = (*st)->copy_to_device(*r0, dev);
      REQUIRE(first.has_value());
      CHECK(first->direct());
      REQUIRE(first->wait().is_ok());
      std::vector<std::byte> want1(n);
      fill(want1, 1);
      CHECK(device_bytes(dev, n) == want1);
      REQUIRE(r0->release().is_ok());
    }
    CHECK((*st)->stats().registration_error.empty());
    CHECK((*st)->stats().registered_bytes >= n);

    // Evict (written back, dropped from RAM), then a write lease refetches it and the CPU
    // overwrites it through the client's mapping. Had tierd punched the registered pages,
    // the refetch and the new bytes would be in fresh pages while the device still read the
    // pinned old ones: the H2D would return the first bytes.
    uint64_t id = t->id;
    REQUIRE(c.evict("gpu", {&id, 1}).is_ok());
    {
      auto w = c.lease(t->id, tier::LeaseMode::kWrite);
      REQUIRE(w.has_value());
      fill(w->bytes(), 2);
      REQUIRE(w->release().is_ok());
    }
    auto r = c.lease(t->id, tier::LeaseMode::kRead);
    REQUIRE(r.has_value());
    auto up = (*st)->copy_to_device(*r, dev);
    REQUIRE(up.has_value());
    CHECK(up->direct());
    REQUIRE(up->wait().is_ok());
    std::vector<std::byte> want(n);
    fill(want, 2);
    CHECK(device_bytes(dev, n) == want);
    CHECK(std::memcmp(r->bytes().data(), want.data(), n) == 0);
    CHECK((*st)->stats().pageable_bytes == 0);
    REQUIRE(r->release().is_ok());
    cudaFree(dev);
    st->reset();
  }
  std::filesystem::remove_all(nvme);
}

TEST_CASE("a group reader's read-only arena is registered read-only and copied direct", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  constexpr gid_t kReaders = 4243;
  tier::test::TestDaemon daemon;
  REQUIRE(::chmod(daemon.dir().c_str(), 0755) == 0);  // uid 65534 must reach the socket
  const size_t n = 2u << 20;
  // The owner (uid 65534, a forked child that touches no CUDA) makes a group-readable pool.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    auto cl = tier::Client::connect(daemon.socket());
    if (!cl) _exit(4);
    if (!(*cl)->create_pool("shared",
                            {.ram_quota = 16 << 20, .nvme_quota = 0, .group = kReaders, .group_read = true}))
      _exit(5);
    auto t = (*cl)->create_tensor("shared", {.name = "t", .size = n, .shape = {}, .placement = {}});
    if (!t) _exit(6);
    auto l = (*cl)->lease(t->id, tier::LeaseMode::kWrite);
    if (!l) _exit(7);
    fill(l->bytes(), 5);
    if (!l->release().is_ok()) _exit(8);
    uint64_t id = t->id;
    (void)!::write(p[1], &id, sizeof id);
    _exit(0);
  }
  ::close(p[1]);
  uint64_t id = 0;
  REQUIRE(::read(p[0], &id, sizeof id) == sizeof id);
  ::close(p[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));

  // This process joins the read group for its connection (SO_PEERGROUPS), then restores.
  std::vector<gid_t> saved(static_cast<size_t>(::getgroups(0, nullptr)));
  REQUIRE(::getgroups(static_cast<int>(saved.size()), saved.data()) == static_cast<int>(saved.size()));
  const gid_t readers[] = {kReaders};
  REQUIRE(::setgroups(1, readers) == 0);
  auto client = tier::Client::connect(daemon.socket());
  REQUIRE(::setgroups(saved.size(), saved.data()) == 0);
  REQUIRE(client.has_value());
  auto& c = **client;
  auto r = c.lease(id, tier::LeaseMode::kRead);
  REQUIRE(r.has_value());
  const auto arenas = c.mapped_arenas();
  REQUIRE(arenas.size() == 1);
  CHECK(arenas[0].read_only);

  auto st = tier::gpu::Stager::create(c);
  REQUIRE(st.has_value());
  int dev_id = 0, ro_ok = 0;
  REQUIRE(cudaGetDevice(&dev_id) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&ro_ok, cudaDevAttrHostRegisterReadOnlySupported, dev_id) == cudaSuccess);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n) == cudaSuccess);
  auto up = (*st)->copy_to_device(*r, dev);
  REQUIRE(up.has_value());
  REQUIRE(up->wait().is_ok());
  std::vector<std::byte> want(n);
  fill(want, 5);
  CHECK(device_bytes(dev, n) == want);
  if (ro_ok) {
    CHECK((*st)->stats().registration_error.empty());
    CHECK(up->direct());
    CHECK((*st)->stats().pageable_bytes == 0);
  } else {
    // Never a silent fallback: the refusal is reported and the bytes are counted pageable.
    CHECK_THAT((*st)->stats().registration_error, Catch::Contains("ReadOnly"));
    CHECK_FALSE(up->direct());
  }
  REQUIRE(r->release().is_ok());
  cudaFree(dev);
}
