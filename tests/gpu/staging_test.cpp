// tier::gpu staging: the API's behaviour without a device (runs everywhere) and a round trip of
// leased tensors through the GPU (skips visibly without one).
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "gpu_support.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"
#include "tier/gpu.hpp"

namespace {

bool device_present() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

// Page-aligned host memory (registered ranges of two buffers must not share a page).
struct PageBuffer {
  explicit PageBuffer(size_t n)
      : n(n), p(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~PageBuffer() { std::free(p); }
  std::span<std::byte> span() const { return {p, n}; }
  size_t n;
  std::byte* p;
};

}  // namespace

TEST_CASE("staging API reports a missing device as kUnsupported, not a crash", "[gpu]") {
  auto count = tier::gpu::device_count();
  auto stager = tier::gpu::Stager::create_detached();
  if (!device_present()) {
    REQUIRE_FALSE(count.has_value());
    CHECK(count.error().code() == tier::Code::kUnsupported);
    CHECK(count.error().message().starts_with("no CUDA device"));
    REQUIRE_FALSE(stager.has_value());
    CHECK(stager.error().code() == tier::Code::kUnsupported);
    CHECK(stager.error().message().starts_with("no CUDA device"));
    auto node = tier::gpu::device_numa_node(0);
    REQUIRE_FALSE(node.has_value());
    CHECK(node.error().code() == tier::Code::kUnsupported);
  } else {
    REQUIRE(count.has_value());
    CHECK(*count > 0);
    REQUIRE(stager.has_value());
    // A device index past the end is a clear argument error.
    auto bad = tier::gpu::Stager::create_detached({.device = *count});
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().code() == tier::Code::kInvalidArgument);
  }
}

TEST_CASE("staging rejects empty copies and null device pointers", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  auto st = tier::gpu::Stager::create_detached();
  REQUIRE(st.has_value());
  std::vector<std::byte> host(4096);
  auto empty = (*st)->copy_to_device(std::span<const std::byte>(), reinterpret_cast<void*>(0x1000));
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.error().code() == tier::Code::kInvalidArgument);
  auto null = (*st)->copy_to_device(std::span<const std::byte>(host), nullptr);
  REQUIRE_FALSE(null.has_value());
  CHECK(null.error().code() == tier::Code::kInvalidArgument);
}

TEST_CASE("registered private memory round-trips through the device directly", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  auto st = tier::gpu::Stager::create_detached({.chunk_bytes = 1 << 20});
  REQUIRE(st.has_value());
  const size_t n = (5 << 20) + 123;  // several chunks and a remainder
  PageBuffer src_buf(n), back_buf(n);
  std::span<std::byte> src = src_buf.span(), back = back_buf.span();
  for (size_t i = 0; i < n; ++i) src[i] = std::byte(i * 131 % 251);
  REQUIRE((*st)->register_range(src).is_ok());
  REQUIRE((*st)->register_range(back).is_ok());
  CHECK((*st)->is_registered(src.data(), n));
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n) == cudaSuccess);
  auto up = (*st)->copy_to_device(std::span<const std::byte>(src), dev);
  REQUIRE(up.has_value());
  CHECK(up->direct());
  REQUIRE(up->wait().is_ok());
  auto down = (*st)->copy_to_host(dev, std::span<std::byte>(back));
  REQUIRE(down.has_value());
  REQUIRE(down->wait().is_ok());
  CHECK(down->done());
  CHECK(std::memcmp(src.data(), back.data(), n) == 0);
  const auto stats = (*st)->stats();
  CHECK(stats.direct_bytes == 2 * n);
  CHECK(stats.pageable_bytes == 0);
  CHECK(stats.chunks == 2 * 6);
  cudaFree(dev);
}

TEST_CASE("a leased tensor round-trips through the device from the arena", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  tier::test::DaemonOptions dopts;
  dopts.ram = "128M";
  tier::test::TestDaemon daemon(dopts);
  auto client = tier::Client::connect(daemon.socket());
  REQUIRE(client.has_value());
  auto& c = **client;
  REQUIRE(c.create_pool("gpu", {}, true).has_value());
  const uint64_t size = 8ull << 20;
  tier::TensorDesc desc;
  desc.size = size;
  desc.name = "a";
  auto a = c.create_tensor("gpu", desc);
  desc.name = "b";
  auto b = c.create_tensor("gpu", desc);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());

  auto wa = c.lease(a->id, tier::LeaseMode::kWrite);
  REQUIRE(wa.has_value());
  auto bytes = wa->bytes();
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 % 253);

  auto st = tier::gpu::Stager::create(c, {.chunk_bytes = 3 << 20});
  REQUIRE(st.has_value());
  CHECK((*st)->stats().registration_error.empty());
  CHECK_FALSE((*st)->is_registered(bytes.data(), bytes.size()));  // on demand: the first copy pins

  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, size) == cudaSuccess);
  auto up = (*st)->copy_to_device(*wa, dev);
  REQUIRE(up.has_value());
  CHECK(up->direct());  // straight from the arena: no bounce buffer
  CHECK((*st)->is_registered(bytes.data(), bytes.size()));
  REQUIRE(up->wait().is_ok());

  auto rb = c.lease(b->id, tier::LeaseMode::kRead);
  REQUIRE(rb.has_value());
  auto refused = (*st)->copy_to_host(dev, *rb);  // a read lease is not a copy target
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code() == tier::Code::kInvalidArgument);
  REQUIRE(rb->release().is_ok());

  auto wb = c.lease(b->id, tier::LeaseMode::kWrite);
  REQUIRE(wb.has_value());
  auto down = (*st)->copy_to_host(dev, *wb);
  REQUIRE(down.has_value());
  CHECK(down->direct());
  REQUIRE(down->wait().is_ok());
  CHECK(std::memcmp(wa->bytes().data(), wb->bytes().data(), size) == 0);
  CHECK((*st)->stats().pageable_bytes == 0);
  cudaFree(dev);
}

TEST_CASE("on-demand registration pins only the pieces a copy touches", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  tier::test::DaemonOptions dopts;
  dopts.ram = "256M";
  tier::test::TestDaemon daemon(dopts);
  auto client = tier::Client::connect(daemon.socket());
  REQUIRE(client.has_value());
  auto& c = **client;
  REQUIRE(c.create_pool("gpu", {}, true).has_value());
  tier::TensorDesc desc;
  desc.size = 3ull << 20;
  desc.name = "t";
  auto t = c.create_tensor("gpu", desc);
  REQUIRE(t.has_value());
  auto w = c.lease(t->id, tier::LeaseMode::kWrite);
  REQUIRE(w.has_value());
  std::memset(w->bytes().data(), 0x3c, desc.size);

  auto st = tier::gpu::Stager::create(
      c, {.chunk_bytes = 1 << 20, .register_chunk_bytes = 2 << 20, .register_on_demand = true});
  REQUIRE(st.has_value());
  CHECK((*st)->stats().registered_bytes == 0);  // nothing pinned up front
  CHECK_FALSE((*st)->is_registered(w->bytes().data(), desc.size));

  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, desc.size) == cudaSuccess);
  auto up = (*st)->copy_to_device(*w, dev);
  REQUIRE(up.has_value());
  CHECK(up->direct());
  REQUIRE(up->wait().is_ok());
  const auto stats = (*st)->stats();
  CHECK(stats.registered_bytes > 0);
  CHECK(stats.registered_bytes <= desc.size + (4u << 20));  // the covering 2 MiB pieces only
  uint64_t arena_bytes = 0;
  for (const auto& a : c.mapped_arenas()) arena_bytes += a.size;
  CHECK(stats.registered_bytes < arena_bytes);
  std::vector<std::byte> back(desc.size);
  REQUIRE(cudaMemcpy(back.data(), dev, desc.size, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::memcmp(back.data(), w->bytes().data(), desc.size) == 0);
  cudaFree(dev);
}
