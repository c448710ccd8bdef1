// tier-bench-gpu-pipeline: does fetch → gather → compute of consecutive layers overlap?
// L layers of parameters live in tierd tensors (leased, registered by tier::gpu::Stager); each
// step fetches every layer through LayerPipeline (H2D straight from the arena on the copy
// stream, the one-rank "gather" on the comm path) and runs a bf16 tensor-core GEMM that reads
// the fetched layer on the compute stream. Measured side by side in one run:
//   H2D alone, compute alone, overlapped (the pipeline), serialized (sync after each layer).
// JSON lines as tier-bench prints them; "gpu_pipeline_overlap" has value = overlapped ms per
// step, baseline = max(H2D ms, compute ms) (perfect overlap), ratio = value / baseline
// (1.0 is perfect; the serialized figure shows what no overlap costs).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tier/client.hpp"
#include "tier/gpu.hpp"
#include "bench_common.hpp"
#include "bench_gpu_device.hpp"
#include "trainer/cuda/pipeline.hpp"

namespace {

using tier::bench::BenchOptions;
using tier::bench::Figure;

int fail_msg(const std::string& m) {
  std::fprintf(stderr, "tier-bench-gpu-pipeline: %s\n", m.c_str());
  return 1;
}

int run(const BenchOptions& o, int layers, int dim, int rows) {
  auto count = tier::gpu::device_count();
  if (!count) return fail_msg(count.error().to_string());
  const size_t layer_floats = size_t(dim) * dim;  // one dim × dim weight per layer
  const uint64_t layer_bytes = layer_floats * sizeof(float);

  tier::bench::BenchDaemon daemon;
  if (!daemon.start(o, std::to_string((layer_bytes * layers >> 20) + 512) + "M")) return 1;
  auto client = tier::Client::connect(daemon.socket(), {.client_name = "tier-bench-gpu-pipeline",
                                                        .connect_timeout = std::chrono::seconds(10)});
  if (!client) return fail_msg("connect: " + client.error().to_string());
  tier::Client& c = **client;
  const std::string pool = tier::bench::bench_pool_name("gpu-pipeline");
  if (auto p = c.create_pool(pool, {}, true); !p) return fail_msg(p.error().to_string());
  std::vector<tier::Lease> leases;
  for (int l = 0; l < layers; ++l) {
    tier::TensorDesc desc;
    desc.name = "l" + std::to_string(l);
    desc.size = layer_bytes;
    desc.dtype = tier::DType::kF32;
    auto t = tier::bench::create_near_gpu(c, pool, desc, 0, "tier-bench-gpu-pipeline");
    if (!t) return fail_msg("create tensor: " + t.error().to_string());
    auto w = c.lease(t->id, tier::LeaseMode::kWrite);
    if (!w) return fail_msg("lease: " + w.error().to_string());
    auto* f = reinterpret_cast<float*>(w->bytes().data());
    std::fill(f, f + layer_floats, 0.001f * static_cast<float>(l + 1));
    leases.push_back(std::move(*w));
  }
  auto stager = tier::gpu::Stager::create(c, {.device = 0});
  if (!stager) return fail_msg(stager.error().to_string());
  cudaStream_t compute = nullptr;
  cublasHandle_t blas = nullptr;
  float *act = nullptr, *out = nullptr;
  if (cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&act), size_t(rows) * dim * sizeof(float)) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&out), size_t(rows) * dim * sizeof(float)) != cudaSuccess ||
      cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, compute) != CUBLAS_STATUS_SUCCESS)
    return fail_msg("CUDA/cuBLAS setup failed");
  cudaMemsetAsync(act, 0, size_t(rows) * dim * sizeof(float), compute);
  float* wres = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&wres), layer_bytes) != cudaSuccess ||
      cudaMemcpy(wres, leases[0].bytes().data(), layer_bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return fail_msg("device layer setup failed");
  auto pl = tier::train::cuda::LayerPipeline::create(**stager, nullptr, compute,
                                                     {.shard_floats = layer_floats, .depth = 2});
  if (!pl) return fail_msg(pl.error().to_string());
  auto& p = **pl;

  // out[rows, dim] = act[rows, dim] @ W^T, W the fetched layer (bf16 tensor cores, fp32 acc).
  auto layer_gemm = [&](const float* w) {
    const float one = 1.0f, zero = 0.0f;
    return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, dim, rows, dim, &one, w, CUDA_R_32F, dim, act,
                        CUDA_R_32F, dim, &zero, out, CUDA_R_32F, dim, CUBLAS_COMPUTE_32F_FAST_16BF,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  };
  auto span_of = [&](int l) {
    return std::span<const float>(reinterpret_cast<const float*>(leases[l].bytes().data()), layer_floats);
  };
  // One step in a mode: fetch and/or compute every layer; `serial` syncs after each layer.
  auto step = [&](bool fetch, bool gemm, bool serial) -> bool {
    float* w = wres;  // compute-only steps read a device-resident layer
    for (int l = 0; l < layers; ++l) {
      if (fetch) {
        auto f = p.fetch(l, span_of(l));
        if (!f) return false;
        w = *f;
      }
      if (gemm && !layer_gemm(w)) return false;
      if (fetch && !p.done_with(l).is_ok()) return false;
      if (serial && cudaStreamSynchronize(compute) != cudaSuccess) return false;
    }
    return cudaStreamSynchronize(compute) == cudaSuccess &&
           cudaStreamSynchronize(p.copy_stream()) == cudaSuccess;
  };
  if (!step(true, true, false)) return fail_msg("warm-up step failed");
  const int samples = o.quick ? 3 : 7;
  auto time_of = [&](bool fetch, bool gemm, bool serial) {
    std::vector<double> ms;
    for (int s = 0; s < samples; ++s) {
      const uint64_t t0 = tier::bench::now_ns();
      if (!step(fetch, gemm, serial)) return -1.0;
      ms.push_back(static_cast<double>(tier::bench::now_ns() - t0) * 1e-6);
    }
    return tier::bench::median(ms);
  };
  // Interleave the modes so drift hits them alike.
  std::vector<double> h2d, comp, ovl, ser;
  for (int r = 0; r < 2; ++r) {
    h2d.push_back(time_of(true, false, false));
    comp.push_back(time_of(false, true, false));
    ovl.push_back(time_of(true, true, false));
    ser.push_back(time_of(true, true, true));
  }
  for (const auto* v : {&h2d, &comp, &ovl, &ser})
    if (std::ranges::any_of(*v, [](double x) { return x < 0; })) return fail_msg("a step failed");
  const double th = tier::bench::median(h2d), tc = tier::bench::median(comp), to = tier::bench::median(ovl),
               ts = tier::bench::median(ser);
  const double ideal = std::max(th, tc);
  const uint64_t step_bytes = layer_bytes * layers;
  tier::bench::emit(o, Figure{"gpu_pipeline_overlap", step_bytes, to, "ms", ideal, to / ideal});
  tier::bench::emit(o, Figure{"gpu_pipeline_serial", step_bytes, ts, "ms", ideal, ts / ideal});
  tier::bench::emit(o, Figure{"gpu_pipeline_h2d", step_bytes, double(step_bytes) / 1e6 / th, "GB/s",
                              double(step_bytes) / 1e6 / th, 1.0});
  const double tflops = 2.0 * rows * double(dim) * dim * layers / (tc * 1e-3) / 1e12;
  tier::bench::emit(o, Figure{"gpu_pipeline_gemm", std::nullopt, tflops, "TFLOP/s", tflops, 1.0});

  pl->reset();
  cublasDestroy(blas);
  cudaFree(act);
  cudaFree(out);
  cudaFree(wres);
  cudaStreamDestroy(compute);
  stager->reset();
  for (auto& l : leases) (void)l.release();
  (void)c.drop_pool(pool);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  int layers = 16, dim = 4096, rows = 16384;
  CLI::App app{"tier-bench-gpu-pipeline: overlap of layer fetch (tierd → GPU) and compute"};
  app.add_flag("--json", o.json, "JSON lines only");
  app.add_option("--socket", o.socket, "a running tierd (default: start a private one)");
  app.add_flag("--quick", o.quick, "fewer samples");
  app.add_option("--layers", layers, "layers per step")->capture_default_str();
  app.add_option("--dim", dim, "layer weight is dim x dim floats")->capture_default_str();
  app.add_option("--rows", rows, "activation rows per GEMM (sets compute per layer)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return app.exit(e) == 0 ? 0 : 2; }
  if (layers < 1 || dim < 1 || rows < 1) return 2;
  return run(o, layers, dim, rows);
}
