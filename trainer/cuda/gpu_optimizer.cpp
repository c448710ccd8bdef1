#include "trainer/cuda/gpu_optimizer.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "tier/gpu.hpp"
#include "trainer/cuda/adamw_params.hpp"
#include "trainer/cuda/cuda_backend.hpp"
#include "trainer/cuda/pipeline.hpp"
#include "wire/errors.hpp"

namespace tier::train::cuda {
namespace {

class GpuOptimizer final : public OffloadOptimizer {
 public:
  GpuOptimizer(std::unique_ptr<tier::gpu::Stager> st, cudaStream_t compute)
      : stager_(std::move(st)), compute_(compute) {}
  const char* name() const override { return "gpu"; }

  Status update(const float* p, const float* m, const float* v, const float* g, float* p_out, float* m_out,
                float* v_out, size_t n, const AdamWStep& s, bool decay, int64_t step) override {
    if (n == 0) return Status::ok();
    TIER_RETURN_IF_ERROR(prepare(p, m, v, p_out, m_out, v_out, n));
    return pipeline_->adamw({p_out, n}, {m_out, n}, {v_out, n}, {g, n}, kernel_adamw(s, step, decay));
  }

  Status update_bf16(const float* p, const float* m, const float* v, const uint16_t* g, float* p_out,
                     float* m_out, float* v_out, uint16_t* w_out, size_t n, const AdamWStep& s, bool decay,
                     int64_t step) override {
    if (n == 0) return Status::ok();
    TIER_RETURN_IF_ERROR(prepare(p, m, v, p_out, m_out, v_out, n));
    return pipeline_->adamw_bf16({p_out, n}, {m_out, n}, {v_out, n}, {g, n}, kernel_adamw(s, step, decay),
                                 {w_out, n});
  }

 private:
  std::unique_ptr<tier::gpu::Stager> stager_;
  cudaStream_t compute_ = nullptr;
  std::unique_ptr<LayerPipeline> pipeline_;
  size_t capacity_ = 0;

  // A pipeline whose device buffers hold n elements (grown on demand), and the old p, m, v in
  // the output buffers, which the pipeline updates in place.
  Status prepare(const float* p, const float* m, const float* v, float* p_out, float* m_out, float* v_out,
                 size_t n) {
    if (!pipeline_ || n > capacity_) {
      pipeline_.reset();
      PipelineOptions po;
      po.shard_floats = n;
      po.depth = 1;
      auto pl = LayerPipeline::create(*stager_, nullptr, compute_, po);
      if (!pl) return pl.error();
      pipeline_ = std::move(*pl);
      capacity_ = n;
    }
    if (p_out != p) std::memcpy(p_out, p, n * sizeof(float));
    if (m_out != m) std::memcpy(m_out, m, n * sizeof(float));
    if (v_out != v) std::memcpy(v_out, v, n * sizeof(float));
    return Status::ok();
  }
};

}  // namespace

std::unique_ptr<OffloadOptimizer> make_gpu_optimizer(Backend& backend, std::string* error) {
  auto* stream = static_cast<cudaStream_t>(backend_stream(backend));
  if (stream == nullptr) {
    if (error) *error = "--optimizer gpu needs --backend cuda";
    return nullptr;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) (void)cudaGetLastError();  // the backend's device
  tier::gpu::StagerOptions so;
  so.device = device;
  so.allow_pageable = true;
  auto st = tier::gpu::Stager::create_detached(so);
  if (!st) {
    if (error) *error = st.error().to_string();
    return nullptr;
  }
  return std::make_unique<GpuOptimizer>(std::move(*st), stream);
}

}  // namespace tier::train::cuda
