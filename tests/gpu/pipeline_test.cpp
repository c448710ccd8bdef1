// The layer pipeline and the NCCL communicator on one rank: fetch puts a shard's bytes into the
// layer buffer the compute stream sees, push_grad brings a gradient back into its host shard,
// the GPU AdamW over host shards matches the CPU AdamW, and a one-rank NCCL communicator
// (no MPI needed) gathers and reduce-scatters; the same in bf16 (--precision bf16), and a bf16
// pipeline whose compute reads the gathered bf16 layer itself (compute_bf16). Skips
// visibly without a device.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gpu_support.hpp"
#include "tier/gpu.hpp"
#include "trainer/bf16.hpp"
#include "trainer/cuda/adamw_params.hpp"
#include "trainer/cuda/nccl_comm.hpp"
#include "trainer/cuda/pipeline.hpp"
#include "trainer/optimizer.hpp"

namespace {

std::vector<float> ramp(size_t n, float a, float b) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = a + b * static_cast<float>(i % 1013) / 1013.0f;
  return v;
}

std::vector<float> device_get(const float* d, size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// A detached stager and a compute stream for the one-rank pipeline cases; a pipeline made on
// them must be destroyed first (declared after).
struct Device {
  std::unique_ptr<tier::gpu::Stager> stager;
  cudaStream_t compute = nullptr;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    if (compute) (void)cudaStreamDestroy(compute);
  }
};

std::unique_ptr<Device> open_device() {
  auto d = std::make_unique<Device>();
  auto st = tier::gpu::Stager::create_detached();
  REQUIRE(st.has_value());
  d->stager = std::move(*st);
  REQUIRE(cudaStreamCreateWithFlags(&d->compute, cudaStreamNonBlocking) == cudaSuccess);
  return d;
}

// The compute stream writes `g` into layer 5's gradient buffer; `push` (push_grad or
// push_grad_bf16 of layer 5) brings it back to the host, waited for.
template <class Push> void push_gradient(tier::train::cuda::LayerPipeline& p, const std::vector<float>& g,
                                         cudaStream_t compute, Push push) {
  auto gbuf = p.grad_buffer(5, g.size());
  REQUIRE(gbuf.has_value());
  REQUIRE(cudaMemcpyAsync(*gbuf, g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice, compute) ==
          cudaSuccess);
  auto t = push();
  REQUIRE(t.has_value());
  REQUIRE(t->wait().is_ok());
}

// Three layers of n bf16 values (ramps rounded to bf16).
std::vector<std::vector<uint16_t>> bf16_layers(size_t n) {
  std::vector<std::vector<uint16_t>> shards;
  for (int l = 0; l < 3; ++l) {
    const std::vector<float> f = ramp(n, static_cast<float>(l) - 1.0f, 3.0f);
    shards.emplace_back(n);
    tier::train::f32_to_bf16(f.data(), shards.back().data(), n);
  }
  return shards;
}

// An fp32 gradient of n values written on the device comes back from push_grad_bf16 as the
// host's rounding of it; returns that rounding.
std::vector<uint16_t> check_bf16_gradient(tier::train::cuda::LayerPipeline& p, size_t n,
                                          cudaStream_t compute) {
  std::vector<uint16_t> grad_host(n, 0xdead);
  const std::vector<float> g = ramp(n, -0.5f, 1.0f);
  push_gradient(p, g, compute, [&] { return p.push_grad_bf16(5, grad_host); });
  std::vector<uint16_t> g16(n);
  tier::train::f32_to_bf16(g.data(), g16.data(), n);
  CHECK(grad_host == g16);
  return g16;
}

}  // namespace

TEST_CASE("layer pipeline on one rank: fetch, gradients back, GPU AdamW", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  const auto dev = open_device();
  cudaStream_t compute = dev->compute;
  const size_t n = 300007;
  auto pl = tier::train::cuda::LayerPipeline::create(*dev->stager, nullptr, compute,
                                                     {.shard_floats = n, .depth = 2});
  REQUIRE(pl.has_value());
  auto& p = **pl;

  // Three layers through two slots: the third reuses the first slot.
  std::vector<std::vector<float>> shards;
  for (int l = 0; l < 3; ++l) {
    shards.push_back(ramp(n, static_cast<float>(l), 1.0f));
    REQUIRE(dev->stager->register_range(std::as_writable_bytes(std::span<float>(shards.back()))).is_ok());
  }
  for (int l = 0; l < 3; ++l) {
    auto full = p.fetch(l, shards[l]);
    REQUIRE(full.has_value());
    CHECK(device_get(*full, n, compute) == shards[l]);
    REQUIRE(p.done_with(l).is_ok());
  }
  CHECK_FALSE(p.done_with(17).is_ok());

  // Gradient: the compute stream writes the buffer, push_grad lands it in the host shard.
  std::vector<float> grad_host(n, -1.0f);
  REQUIRE(dev->stager->register_range(std::as_writable_bytes(std::span<float>(grad_host))).is_ok());
  const std::vector<float> g = ramp(n, -0.5f, 1.0f);
  push_gradient(p, g, compute, [&] { return p.push_grad(5, grad_host); });
  CHECK(grad_host == g);

  // GPU AdamW over host shards vs the CPU AdamW.
  std::vector<float> pw = ramp(n, -1.0f, 2.0f), m(n, 0.01f), v(n, 0.002f);
  std::vector<float> pc(n), mc(n), vc(n);
  tier::train::AdamWConfig cfg;
  const auto st = tier::train::make_step(cfg, 1e-3f, 2, 1.0f);
  tier::train::adamw_update_scalar(pw.data(), m.data(), v.data(), g.data(), pc.data(), mc.data(), vc.data(),
                                   n, st, true);
  REQUIRE(p.adamw(pw, m, v, g, tier::train::cuda::kernel_adamw(st, 2, true)).is_ok());
  double err = 0;
  for (size_t i = 0; i < n; ++i)
    err = std::max({err, std::abs(double(pw[i]) - pc[i]), std::abs(double(m[i]) - mc[i]),
                    std::abs(double(v[i]) - vc[i])});
  CHECK(err <= 1e-6);
  pl->reset();
}

TEST_CASE("one-rank NCCL communicator gathers and reduce-scatters fp32 and bf16 without MPI", "[gpu][bf16]") {
  if (!tier::test::have_cuda_device()) return;
  auto comm = tier::train::cuda::NcclComm::create(0, 1, 0);
  REQUIRE(comm.has_value());
  CHECK((*comm)->size() == 1);
  const size_t n = 4096;
  const std::vector<float> h = ramp(n, 3.0f, 1.0f);
  float *a = nullptr, *b = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&a), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&b), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE((*comm)->all_gather(a, b, n, nullptr).is_ok());
  CHECK(device_get(b, n, nullptr) == h);
  REQUIRE(cudaMemset(b, 0, n * sizeof(float)) == cudaSuccess);
  REQUIRE((*comm)->reduce_scatter(a, b, n, nullptr).is_ok());
  CHECK(device_get(b, n, nullptr) == h);

  // The same in bf16 (ncclBfloat16) on the bits of n bf16 values, which fill half the buffers.
  std::vector<uint16_t> h16(n), got(n);
  for (size_t i = 0; i < n; ++i) h16[i] = static_cast<uint16_t>(0x3f80 + i % 127);
  auto* a16 = reinterpret_cast<uint16_t*>(a);
  auto* b16 = reinterpret_cast<uint16_t*>(b);
  REQUIRE(cudaMemcpy(a16, h16.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE((*comm)->all_gather_bf16(a16, b16, n, nullptr).is_ok());
  REQUIRE(cudaMemcpy(got.data(), b16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(got == h16);
  REQUIRE(cudaMemset(b16, 0, n * sizeof(uint16_t)) == cudaSuccess);
  REQUIRE((*comm)->reduce_scatter_bf16(a16, b16, n, nullptr).is_ok());
  REQUIRE(cudaMemcpy(got.data(), b16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(got == h16);
  cudaFree(a);
  cudaFree(b);
}

TEST_CASE("layer pipeline in bf16 on one rank: fetch widens, gradients rounded, AdamW of a bf16 gradient",
          "[gpu][bf16]") {
  if (!tier::test::have_cuda_device()) return;
  const auto dev = open_device();
  cudaStream_t compute = dev->compute;
  const size_t n = 300007;
  namespace tt = tier::train;
  auto pl = tt::cuda::LayerPipeline::create(*dev->stager, nullptr, compute,
                                            {.shard_floats = n, .depth = 2, .bf16 = true});
  REQUIRE(pl.has_value());
  auto& p = **pl;

  // Three bf16 layers through two slots: each arrives widened, exactly.
  const std::vector<std::vector<uint16_t>> shards = bf16_layers(n);
  for (int l = 0; l < 3; ++l) {
    auto full = p.fetch_bf16(l, shards[l]);
    REQUIRE(full.has_value());
    std::vector<float> want(n);
    tt::bf16_to_f32(shards[l].data(), want.data(), n);
    CHECK(device_get(*full, n, compute) == want);
    REQUIRE(p.done_with(l).is_ok());
  }

  // An fp32 gradient on the device comes back as the host's rounding of it.
  const std::vector<uint16_t> g16 = check_bf16_gradient(p, n, compute);

  // AdamW of a bf16 gradient against the CPU's one-pass bf16 AdamW; the working copy is the
  // new master rounded (exactly the host's rounding of the GPU's master).
  std::vector<float> pw = ramp(n, -1.0f, 2.0f), m(n, 0.01f), v(n, 0.002f);
  std::vector<float> pc(n), mc(n), vc(n);
  std::vector<uint16_t> wc(n), w(n, 0xdead);
  tt::AdamWConfig cfg;
  const auto st = tt::make_step(cfg, 1e-3f, 2, 1.0f);
  tt::adamw_update_bf16(pw.data(), m.data(), v.data(), g16.data(), pc.data(), mc.data(), vc.data(), wc.data(),
                        n, st, true);
  REQUIRE(p.adamw_bf16(pw, m, v, g16, tt::cuda::kernel_adamw(st, 2, true), w).is_ok());
  double err = 0;
  for (size_t i = 0; i < n; ++i)
    err = std::max({err, std::abs(double(pw[i]) - pc[i]), std::abs(double(m[i]) - mc[i]),
                    std::abs(double(v[i]) - vc[i])});
  CHECK(err <= 1e-6);
  std::vector<uint16_t> w_of_p(n);
  tt::f32_to_bf16(pw.data(), w_of_p.data(), n);
  CHECK(w == w_of_p);
  // A bf16 fetch on a pipeline made for fp32 is refused.
  auto fp32 =
      tt::cuda::LayerPipeline::create(*dev->stager, nullptr, compute, {.shard_floats = 16, .depth = 1});
  REQUIRE(fp32.has_value());
  CHECK((*fp32)->fetch_bf16(0, std::span<const uint16_t>(shards[0].data(), 16)).error().code() ==
        tier::Code::kInvalidArgument);
  fp32->reset();
  pl->reset();
}

TEST_CASE("layer pipeline computing from bf16: fetch_bf16_layer gives the gathered bf16 bits",
          "[gpu][bf16]") {
  if (!tier::test::have_cuda_device()) return;
  const auto dev = open_device();
  cudaStream_t compute = dev->compute;
  const size_t n = 100003;
  namespace tt = tier::train;
  auto pl = tt::cuda::LayerPipeline::create(
      *dev->stager, nullptr, compute, {.shard_floats = n, .depth = 2, .bf16 = true, .compute_bf16 = true});
  REQUIRE(pl.has_value());
  auto& p = **pl;
  // Three layers through two slots: each arrives as the same bf16 bits, not widened.
  const std::vector<std::vector<uint16_t>> shards = bf16_layers(n);
  for (int l = 0; l < 3; ++l) {
    auto layer = p.fetch_bf16_layer(l, shards[l]);
    REQUIRE(layer.has_value());
    std::vector<uint16_t> got(n);
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
    REQUIRE(cudaMemcpy(got.data(), *layer, n * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(got == shards[l]);
    REQUIRE(p.done_with(l).is_ok());
  }
  // Gradients still go back rounded from the fp32 layer gradient.
  (void)check_bf16_gradient(p, n, compute);
  // The widening fetch and fp32 moves are refused: the slots hold no fp32 layer.
  CHECK(p.fetch_bf16(0, shards[0]).error().code() == tier::Code::kInvalidArgument);
  const std::vector<float> f32(n, 1.0f);
  CHECK(p.fetch(0, f32).error().code() == tier::Code::kInvalidArgument);
  pl->reset();
}

TEST_CASE("NCCL communicator without a device says so", "[gpu]") {
  int n = 0;
  const bool present = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  auto bad = tier::train::cuda::NcclComm::create(1, 1, 0);  // rank out of range: always refused
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == tier::Code::kInvalidArgument);
  if (!present) {
    auto c = tier::train::cuda::NcclComm::create(0, 1, 0);
    REQUIRE_FALSE(c.has_value());
    CHECK(c.error().code() == tier::Code::kUnsupported);
    CHECK(c.error().message().starts_with("no CUDA device"));
  }
}
