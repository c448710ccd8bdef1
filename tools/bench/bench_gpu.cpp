// tier-bench-gpu: H2D and D2H of a leased tensor straight from/to the tierd arena (registered
// by tier::gpu::Stager) against cudaMemcpyAsync from/to cudaMallocHost memory of the same size,
// measured side by side (interleaved samples) in one run. JSON lines as tier-bench prints them:
//   {"name":"gpu_h2d_arena","bytes":…,"value":GB/s,"unit":"GB/s","baseline":GB/s,"ratio":…}
// Target: ratio >= 0.95 (docs/benchmarks.md). Exit 0 ok, 1 error (message on stderr), 2 usage; without
// a CUDA device it prints the reason and exits 1.
// --info: one JSON object with the CUDA driver and runtime versions and every device's name,
// PCI bus id, compute capability and memory (what the GPU check prints about the machine).
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tier/client.hpp"
#include "tier/gpu.hpp"
#include "bench_common.hpp"

namespace {

using tier::bench::BenchOptions;
using tier::bench::Figure;

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "tier-bench-gpu: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// --info. Without a device: {"driver_version":…,"runtime_version":…,"error":"no CUDA device: …"}.
int info() {
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  nlohmann::json j{{"driver_version", driver}, {"runtime_version", runtime}};
  auto count = tier::gpu::device_count();
  if (!count) {
    j["error"] = count.error().to_string();
    std::printf("%s\n", j.dump().c_str());
    return 1;
  }
  j["devices"] = nlohmann::json::array();
  for (int d = 0; d < *count; ++d) {
    cudaDeviceProp p{};
    char bus[32] = {};
    if (!cuda_ok(cudaGetDeviceProperties(&p, d), "cudaGetDeviceProperties") ||
        !cuda_ok(cudaDeviceGetPCIBusId(bus, sizeof bus, d), "cudaDeviceGetPCIBusId"))
      return 1;
    j["devices"].push_back({{"index", d},
                            {"name", p.name},
                            {"pci_bus_id", bus},
                            {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
                            {"memory_bytes", p.totalGlobalMem},
                            {"numa_node", tier::gpu::device_numa_node(d).value_or(-1)}});
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int run(const BenchOptions& o, int device) {
  auto count = tier::gpu::device_count();
  if (!count) {
    std::fprintf(stderr, "tier-bench-gpu: %s\n", count.error().to_string().c_str());
    return 1;
  }
  const std::vector<uint64_t> sizes = o.quick ? std::vector<uint64_t>{64ull << 20}
                                              : std::vector<uint64_t>{1ull << 20,  4ull << 20,   16ull << 20,
                                                                      64ull << 20, 256ull << 20, 1ull << 30};
  const uint64_t max_size = sizes.back();

  tier::bench::BenchDaemon daemon;
  if (!daemon.start(o, std::to_string((2 * max_size >> 20) + 512) + "M")) return 1;
  auto client = tier::Client::connect(
      daemon.socket(), {.client_name = "tier-bench-gpu", .connect_timeout = std::chrono::seconds(10)});
  if (!client) {
    std::fprintf(stderr, "tier-bench-gpu: connect: %s\n", client.error().to_string().c_str());
    return 1;
  }
  tier::Client& c = **client;
  const std::string pool = tier::bench::bench_pool_name("gpu");
  if (auto p = c.create_pool(pool, {}, true); !p) {
    std::fprintf(stderr, "tier-bench-gpu: create pool: %s\n", p.error().to_string().c_str());
    return 1;
  }
  // One source and one target tensor of the largest size, near the GPU.
  tier::TensorDesc desc;
  desc.size = max_size;
  desc.placement = tier::Placement::near_gpu(device);
  desc.name = "src";
  auto src_t = c.create_tensor(pool, desc);
  desc.name = "dst";
  auto dst_t = c.create_tensor(pool, desc);
  if (!src_t || !dst_t) {
    std::fprintf(stderr, "tier-bench-gpu: create tensor: %s\n",
                 (!src_t ? src_t.error() : dst_t.error()).to_string().c_str());
    return 1;
  }
  auto src = c.lease(src_t->id, tier::LeaseMode::kWrite);
  auto dst = c.lease(dst_t->id, tier::LeaseMode::kWrite);
  if (!src || !dst) {
    std::fprintf(stderr, "tier-bench-gpu: lease: %s\n",
                 (!src ? src.error() : dst.error()).to_string().c_str());
    return 1;
  }
  std::memset(src->bytes().data(), 0x5a, max_size);
  std::memset(dst->bytes().data(), 0, max_size);

  // Registration of the arenas (what Stager::create does) vs pinning the same bytes with
  // cudaMallocHost: a one-time cost per process.
  uint64_t arena_bytes = 0;
  for (const auto& a : c.mapped_arenas()) arena_bytes += a.size;
  if (!cuda_ok(cudaSetDevice(device), "cudaSetDevice") || !cuda_ok(cudaFree(nullptr), "init")) return 1;
  const uint64_t t0 = tier::bench::now_ns();
  auto stager = tier::gpu::Stager::create(c, {.device = device});
  const double reg_s = static_cast<double>(tier::bench::now_ns() - t0) * 1e-9;
  if (!stager) {
    std::fprintf(stderr, "tier-bench-gpu: %s\n", stager.error().to_string().c_str());
    return 1;
  }
  auto& st = **stager;
  if (!st.stats().registration_error.empty())
    std::fprintf(stderr, "tier-bench-gpu: warning: %s\n", st.stats().registration_error.c_str());
  void* pinned = nullptr;
  const uint64_t t1 = tier::bench::now_ns();
  if (!cuda_ok(cudaMallocHost(&pinned, arena_bytes), "cudaMallocHost")) return 1;
  const double pin_s = static_cast<double>(tier::bench::now_ns() - t1) * 1e-9;
  cudaFreeHost(pinned);
  tier::bench::emit(o, Figure{"gpu_register_arena", arena_bytes, reg_s * 1e3, "ms", pin_s * 1e3,
                              pin_s > 0 ? reg_s / pin_s : 0});

  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  if (!cuda_ok(cudaMallocHost(&host, max_size), "cudaMallocHost") ||
      !cuda_ok(cudaMalloc(&dev, max_size), "cudaMalloc") ||
      !cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"))
    return 1;
  std::memset(host, 0x5a, max_size);

  int rc = 0;
  for (uint64_t n : sizes) {
    const int iters = n >= (256ull << 20) ? 2 : n >= (16ull << 20) ? 8 : 32;
    const int samples = o.quick ? 4 : 10;
    auto arena_h2d = [&] {
      auto t = st.copy_to_device(std::span<const std::byte>(src->bytes().data(), n), dev, stream);
      return t.has_value() && t->direct() && t->wait().is_ok();
    };
    auto pinned_h2d = [&] {
      return cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream) == cudaSuccess &&
             cudaStreamSynchronize(stream) == cudaSuccess;
    };
    auto arena_d2h = [&] {
      auto t = st.copy_to_host(dev, std::span<std::byte>(dst->bytes().data(), n), stream);
      return t.has_value() && t->direct() && t->wait().is_ok();
    };
    auto pinned_d2h = [&] {
      return cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
             cudaStreamSynchronize(stream) == cudaSuccess;
    };
    // Warm up both paths once.
    if (!arena_h2d() || !pinned_h2d()) {
      std::fprintf(stderr, "tier-bench-gpu: H2D failed (arena copy not direct, or a CUDA error)\n");
      rc = 1;
      break;
    }
    const auto h2d = tier::bench::measure_pair(arena_h2d, pinned_h2d, iters, samples);
    const auto d2h = tier::bench::measure_pair(arena_d2h, pinned_d2h, iters, samples);
    if (h2d.measured_s <= 0 || d2h.measured_s <= 0) {
      std::fprintf(stderr, "tier-bench-gpu: a copy failed during measurement\n");
      rc = 1;
      break;
    }
    const double gb = static_cast<double>(n) / 1e9;
    tier::bench::emit(o, Figure{"gpu_h2d_arena", n, gb / h2d.measured_s, "GB/s", gb / h2d.baseline_s,
                                h2d.baseline_s / h2d.measured_s});
    tier::bench::emit(o, Figure{"gpu_d2h_arena", n, gb / d2h.measured_s, "GB/s", gb / d2h.baseline_s,
                                d2h.baseline_s / d2h.measured_s});
  }
  if (st.stats().remote_node_bytes > 0)
    std::fprintf(stderr, "tier-bench-gpu: warning: %llu bytes crossed NUMA nodes (GPU on node %d)\n",
                 static_cast<unsigned long long>(st.stats().remote_node_bytes), st.stats().gpu_numa_node);
  // Every byte of the largest D2H landed in the arena.
  if (rc == 0 && std::memcmp(dst->bytes().data(), host, sizes.back()) != 0) {
    std::fprintf(stderr, "tier-bench-gpu: D2H into the arena did not match the device data\n");
    rc = 1;
  }
  cudaStreamDestroy(stream);
  cudaFree(dev);
  cudaFreeHost(host);
  (void)src->release();
  (void)dst->release();
  stager->reset();
  (void)c.drop_pool(pool);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  int device = 0;
  CLI::App app{"tier-bench-gpu: H2D/D2H from a tierd arena vs cudaMallocHost, side by side"};
  app.add_flag("--json", o.json, "JSON lines only");
  app.add_option("--socket", o.socket, "a running tierd (default: start a private one)");
  app.add_flag("--quick", o.quick, "one size, fewer samples");
  app.add_option("--device", device, "CUDA device index");
  bool want_info = false;
  app.add_flag("--info", want_info, "print the driver, runtime and devices as JSON; measure nothing");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return app.exit(e) == 0 ? 0 : 2; }
  return want_info ? info() : run(o, device);
}
