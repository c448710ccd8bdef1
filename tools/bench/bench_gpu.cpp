// tier-bench-gpu: H2D and D2H of a leased tensor straight from/to the tierd arena (registered
// by tier::gpu::Stager) against cudaMemcpyAsync from/to cudaMallocHost memory of the same size,
// measured side by side (interleaved samples) in one run. JSON lines as tier-bench prints them:
//   {"name":"gpu_h2d_arena","bytes":…,"value":GB/s,"unit":"GB/s","baseline":GB/s,"ratio":…}
// Target: ratio >= 0.95 from 64 MiB up (docs/benchmarks.md); below that, microseconds per
// copy ("gpu_h2d_small_us") against a plain cudaMemcpyAsync: the per-call overhead.
// gpu_register_first_copy: the first copy of a 1 GiB lease (registering its granules) against
// cudaMallocHost + a first copy of the same size. --gemm DIM: the cuBLAS bf16 GEMM rate. Exit 0 ok, 1 error
// (message on stderr), 2 usage; without a CUDA device it prints the reason and exits 1.
// --info: one JSON object with the CUDA driver and runtime versions and every device's name,
// PCI bus id, compute capability and memory (what the GPU check prints about the machine).
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tier/client.hpp"
#include "tier/gpu.hpp"
#include "bench_common.hpp"
#include "bench_gpu_device.hpp"

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
                            {"numa_node", tier::gpu::device_numa_node(d).value_or(-1)},
                            {"sm_count", p.multiProcessorCount},
                            {"bf16_peak_tflops", tier::bench::bf16_peak_tflops(d)}});
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// The first copy of a whole lease through an on-demand stager (it registers the lease's
// granules, then copies) against cudaMallocHost of the same size and a first copy from it:
// the one-time cost a rank pays per shard. `host` receives the cudaMallocHost buffer.
bool first_copy(const BenchOptions& o, tier::gpu::Stager& st, std::span<const std::byte> src, void* dev,
                cudaStream_t stream, void** host) {
  const uint64_t n = src.size();
  const uint64_t t0 = tier::bench::now_ns();
  auto t = st.copy_to_device(src, dev, stream);
  if (!t || !t->wait().is_ok()) {
    std::fprintf(stderr, "tier-bench-gpu: first copy failed: %s\n",
                 t ? "wait" : t.error().to_string().c_str());
    return false;
  }
  const double reg_s = static_cast<double>(tier::bench::now_ns() - t0) * 1e-9;
  if (!t->direct())
    std::fprintf(stderr, "tier-bench-gpu: warning: the first copy was not direct: %s\n",
                 st.stats().registration_error.c_str());
  const uint64_t t1 = tier::bench::now_ns();
  if (!cuda_ok(cudaMallocHost(host, n), "cudaMallocHost") ||
      !cuda_ok(cudaMemcpyAsync(dev, *host, n, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync") ||
      !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"))
    return false;
  const double pin_s = static_cast<double>(tier::bench::now_ns() - t1) * 1e-9;
  tier::bench::emit(
      o, Figure{"gpu_register_first_copy", n, reg_s * 1e3, "ms", pin_s * 1e3, pin_s > 0 ? reg_s / pin_s : 0});
  return true;
}

// Small copies: what a call costs beyond its bytes (event, chunking, lookup), as microseconds
// per copy against a plain cudaMemcpyAsync of the same size; at these sizes bandwidth would
// mostly measure that overhead.
constexpr uint64_t kBandwidthFrom = 64ull << 20;

int run(const BenchOptions& o, int device) {
  auto count = tier::gpu::device_count();
  if (!count) {
    std::fprintf(stderr, "tier-bench-gpu: %s\n", count.error().to_string().c_str());
    return 1;
  }
  const std::vector<uint64_t> sizes = o.quick ? std::vector<uint64_t>{4ull << 20, 64ull << 20}
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
  // One source and one target tensor of the largest size, near the GPU when tierd sees it.
  tier::TensorDesc desc;
  desc.size = max_size;
  desc.name = "src";
  auto src_t = tier::bench::create_near_gpu(c, pool, desc, device, "tier-bench-gpu");
  desc.name = "dst";
  auto dst_t = src_t ? tier::bench::create_near_gpu(c, pool, desc, device, "tier-bench-gpu") : src_t;
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

  if (!cuda_ok(cudaSetDevice(device), "cudaSetDevice") || !cuda_ok(cudaFree(nullptr), "init")) return 1;
  auto stager = tier::gpu::Stager::create(c, {.device = device});  // registers on demand
  if (!stager) {
    std::fprintf(stderr, "tier-bench-gpu: %s\n", stager.error().to_string().c_str());
    return 1;
  }
  auto& st = **stager;
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  if (!cuda_ok(cudaMalloc(&dev, max_size), "cudaMalloc") ||
      !cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !first_copy(o, st, std::span<const std::byte>(src->bytes().data(), max_size), dev, stream, &host))
    return 1;
  std::memset(host, 0x5a, max_size);
  // The first copy registers only what it covers: the target's granules register here.
  if (auto t = st.copy_to_host(dev, std::span<std::byte>(dst->bytes().data(), max_size), stream);
      !t || !t->wait().is_ok()) {
    std::fprintf(stderr, "tier-bench-gpu: first D2H failed\n");
    return 1;
  }

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
    if (n < kBandwidthFrom) {  // microseconds per copy; ratio <= 1 + small is the target
      tier::bench::emit(o, Figure{"gpu_h2d_small_us", n, h2d.measured_s * 1e6, "us", h2d.baseline_s * 1e6,
                                  h2d.measured_s / h2d.baseline_s});
      tier::bench::emit(o, Figure{"gpu_d2h_small_us", n, d2h.measured_s * 1e6, "us", d2h.baseline_s * 1e6,
                                  d2h.measured_s / d2h.baseline_s});
      continue;
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

// --gemm DIM: the cuBLAS bf16 GEMM rate on `device` beside its dense bf16 peak.
int gemm(const BenchOptions& o, int device, int dim) {
  auto count = tier::gpu::device_count();
  if (!count) {
    std::fprintf(stderr, "tier-bench-gpu: %s\n", count.error().to_string().c_str());
    return 1;
  }
  std::string err;
  const double tf = tier::bench::cublas_bf16_gemm_tflops(device, dim, 10, &err);
  if (tf < 0) {
    std::fprintf(stderr, "tier-bench-gpu: --gemm: %s\n", err.c_str());
    return 1;
  }
  const double peak = tier::bench::bf16_peak_tflops(device);
  tier::bench::emit(o, Figure{"gpu_gemm_bf16", std::nullopt, tf, "TFLOP/s", peak, peak > 0 ? tf / peak : 0},
                    "bf16_peak");
  return 0;
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
  int gemm_dim = 0;
  app.add_option("--gemm", gemm_dim, "only the cuBLAS bf16 GEMM rate at m = n = k = DIM vs the device's peak")
      ->check(CLI::Range(256, 32768));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return app.exit(e) == 0 ? 0 : 2; }
  if (want_info) return info();
  return gemm_dim > 0 ? gemm(o, device, gemm_dim) : run(o, device);
}
