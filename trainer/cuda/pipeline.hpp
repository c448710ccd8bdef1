// The GPU side of ZeRO-3 streaming: per layer, the rank's parameter shard goes host → device
// on a copy stream (straight from its tierd lease through tier::gpu::Stager), the full layer is
// all-gathered with NCCL on a comm stream, and the compute stream (the backend's) waits only
// for that layer's gather. Gradients go the other way: compute → reduce-scatter on the comm
// stream → device → host on the D2H stream into the rank's grad shard. Events order the three
// streams, so layer i+1's fetch and gather run while layer i computes:
//
//   copy:    H2D(i)   H2D(i+1)   H2D(i+2) ...        (waits: slot free = consumed(i-depth))
//   comm:       AG(i)     AG(i+1)    AG(i+2) ...     (waits: h2d(i))
//   compute:       F(i)       F(i+1)      F(i+2)     (waits: gathered(i); records consumed(i))
//
// `depth` slots (default 2: double buffering) bound the device memory: depth × (shard + layer)
// floats for parameters and as many for gradients.
//
// The host spans passed in must stay pinned (lease held) until the returned event / Transfer
// completes. Thread-safety: one thread drives a pipeline.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tier/gpu.hpp"
#include "tier/status.hpp"
#include "trainer/cuda/kernels.hpp"
#include "trainer/cuda/nccl_comm.hpp"

namespace tier::train::cuda {

struct PipelineOptions {
  size_t shard_floats = 0;  // the largest per-rank shard (padded layer / ranks), in elements
  int depth = 2;            // layers in flight per direction
  // --precision bf16: each slot also gets bf16 shard and layer buffers, so fetch_bf16 and
  // push_grad_bf16 move and reduce half the bytes.
  bool bf16 = false;
  // bf16 pipelines: the compute reads the gathered bf16 layer itself (fetch_bf16_layer), so
  // parameter slots hold only the bf16 shard and layer, no fp32 copy (half the bytes of the
  // gathered layers on the device). false: fetch_bf16 widens each layer into an fp32 slot.
  bool compute_bf16 = false;
};

class LayerPipeline {
 public:
  // `compute` is the backend's stream (backend_stream()); `comm` may be null for one rank.
  [[nodiscard]] static Result<std::unique_ptr<LayerPipeline>> create(tier::gpu::Stager& stager,
                                                                     NcclComm* comm, cudaStream_t compute,
                                                                     const PipelineOptions& o);
  ~LayerPipeline();
  LayerPipeline(const LayerPipeline&) = delete;
  LayerPipeline& operator=(const LayerPipeline&) = delete;

  // Enqueues H2D of this rank's shard and the all-gather of the layer; returns the device
  // buffer (ranks × shard.size() floats) that will hold the full layer. The compute stream has
  // been made to wait for the gather, so kernels enqueued on it after this call see the layer.
  // The buffer stays valid until `depth` more fetches; call done_with() after the layer's last
  // kernel was enqueued.
  [[nodiscard]] Result<float*> fetch(int layer, std::span<const float> shard);
  // --precision bf16 (PipelineOptions::bf16): the same with a bf16 shard. The H2D and the
  // all-gather move bf16; the layer is widened (exactly) into the returned fp32 buffer on the
  // device before the compute stream may read it.
  [[nodiscard]] Result<float*> fetch_bf16(int layer, std::span<const uint16_t> shard);
  // PipelineOptions::compute_bf16: the same without the widening; returns the device buffer
  // (ranks × shard.size() bf16 values) that will hold the gathered bf16 layer.
  [[nodiscard]] Result<const uint16_t*> fetch_bf16_layer(int layer, std::span<const uint16_t> shard);
  // Records that the compute stream finished enqueuing its use of the layer's slot.
  [[nodiscard]] Status done_with(int layer);

  // A zeroed device buffer (ranks × shard_floats) for the layer's full gradient, ready on the
  // compute stream (it waited for the slot's previous reduce-scatter).
  [[nodiscard]] Result<float*> grad_buffer(int layer, size_t shard_floats);
  // After the compute stream wrote the layer's gradient: reduce-scatter it (sum over ranks)
  // and copy this rank's shard into `shard` (host, pinned). Completes when the Transfer does.
  [[nodiscard]] Result<tier::gpu::Transfer> push_grad(int layer, std::span<float> shard);
  // --precision bf16: the compute stream rounds the layer's fp32 gradient to bf16 (the same bits
  // as the host's f32_to_bf16), NCCL reduce-scatters it in bf16, and the bf16 shard goes to
  // `shard` (host, pinned).
  [[nodiscard]] Result<tier::gpu::Transfer> push_grad_bf16(int layer, std::span<uint16_t> shard);

  // ZeRO-Offload alternative for the optimizer: AdamW on the GPU over host shards (fp32 master
  // p, moments m, v, gradient g, all pinned): H2D, the fused kernel, D2H of p, m, v. Blocks
  // until the shards are back on the host. `working_bf16` (device, may be null) receives the
  // bf16 working copy of the updated parameters.
  [[nodiscard]] Status adamw(std::span<float> p, std::span<float> m, std::span<float> v,
                             std::span<const float> g, const AdamW& h, uint16_t* working_bf16 = nullptr);
  // --precision bf16's update: the gradient `g` is bf16 (widened exactly on the device), and the
  // new bf16 working copy of p comes back into `working` (host, same length) with p, m, v.
  [[nodiscard]] Status adamw_bf16(std::span<float> p, std::span<float> m, std::span<float> v,
                                  std::span<const uint16_t> g, const AdamW& h, std::span<uint16_t> working);

  cudaStream_t copy_stream() const;
  cudaStream_t comm_stream() const;

 private:
  struct Impl;
  explicit LayerPipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tier::train::cuda
