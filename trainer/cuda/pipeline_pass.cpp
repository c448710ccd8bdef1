#include "trainer/cuda/pipeline_pass.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "tier/gpu.hpp"
#include "trainer/cuda/cuda_backend.hpp"
#include "trainer/cuda/nccl_comm.hpp"
#include "trainer/cuda/pipeline.hpp"
#include "trainer/bf16.hpp"
#include "trainer/optimizer.hpp"

#include "cuda_status.hpp"
#include "wire/errors.hpp"

namespace tier::train::cuda {
namespace {

// CUDA errors become Status in one place (cuda/cuda_status.hpp).
Status cu(cudaError_t e, const char* what) { return tier::gpu::check_cuda(e, what); }

class PipelineStream final : public LayerStream {
 public:
  // `bf16_compute`: the backend computes from bf16 layers (Backend::bf16_params()).
  PipelineStream(std::unique_ptr<NcclComm> nccl, cudaStream_t compute, int device, int ranks,
                 bool bf16_compute)
      : nccl_(std::move(nccl)),
        compute_(compute),
        device_(device),
        ranks_(ranks),
        bf16_compute_(bf16_compute) {}

  ~PipelineStream() override {
    (void)finish();
    for (Fetch& f : fetches_)
      if (f.copied) (void)cudaEventDestroy(f.copied);
    if (g0_) (void)cudaFree(g0_);
    // pipeline_ (its streams synchronized by its destructor) goes before stager_ and nccl_.
  }

  const char* name() const override { return "nccl pipeline"; }

  Status open(ShardStore& store, std::span<const size_t> shard_floats, int depth,
              Precision precision) override {
    if (pipeline_) return Status(Code::kInvalidArgument, "pipeline stream opened twice");
    if (shard_floats.empty() || depth < 1)
      return Status(Code::kInvalidArgument, "pipeline stream needs layers and depth >= 1");
    shard_.assign(shard_floats.begin(), shard_floats.end());
    bf16_ = precision == Precision::kBf16;
    tier::gpu::StagerOptions so;
    so.device = device_;
    so.allow_pageable = true;  // a refused registration costs speed, not correctness
    if (Client* c = store.client()) {
      auto st = tier::gpu::Stager::create(*c, so);
      if (!st) return st.error();
      stager_ = std::move(*st);
    } else {
      auto st = tier::gpu::Stager::create_detached(so);
      if (!st) return st.error();
      stager_ = std::move(*st);
      for (std::span<std::byte> r : store.private_ranges()) {
        Status s = stager_->register_range(r);
        if (s.code() == Code::kUnsupported) return s;  // otherwise: copied as pageable memory
      }
    }
    // A refused registration is not an error but must not pass unseen: those shards are
    // copied through CUDA's pageable path, far slower than the registered arena.
    if (const std::string e = stager_->stats().registration_error; !e.empty())
      std::fprintf(stderr, "tier-train: warning: %s; those shards are copied through CUDA's pageable path\n",
                   e.c_str());
    PipelineOptions po;
    po.shard_floats = *std::max_element(shard_.begin(), shard_.end());
    po.depth = depth;
    po.bf16 = bf16_;
    po.compute_bf16 = bf16_ && bf16_compute_;  // the backend reads the gathered bf16 layer itself
    auto pl = LayerPipeline::create(*stager_, ranks_ > 1 ? nccl_.get() : nullptr, compute_, po);
    if (!pl) return pl.error();
    pipeline_ = std::move(*pl);
    fetches_.resize(static_cast<size_t>(depth));
    for (Fetch& f : fetches_)
      TIER_RETURN_IF_ERROR(
          cu(cudaEventCreateWithFlags(&f.copied, cudaEventDisableTiming), "cudaEventCreate"));
    g0_floats_ = shard_[0] * static_cast<size_t>(ranks_);
    return cu(cudaMalloc(reinterpret_cast<void**>(&g0_), g0_floats_ * sizeof(float)),
              "cudaMalloc layer 0 gradient");
  }

  Result<LayerParams> fetch(int layer, Pinned shard) override {
    if (!pipeline_) return fail(Code::kInvalidArgument, "pipeline stream not opened");
    if (open_.size() >= fetches_.size())
      return fail(Code::kInvalidArgument, "fetch with every slot open: done_with_oldest() first");
    if (layer < 0 || static_cast<size_t>(layer) >= shard_.size() || shard.floats != shard_[layer])
      return fail(Code::kInvalidArgument, "fetch: shard does not match the layer's geometry");
    // This ring position's previous shard: its H2D must be complete before the pin goes.
    Fetch& f = fetches_[next_fetch_++ % fetches_.size()];
    if (f.pin.data != nullptr) {
      Status s = cu(cudaEventSynchronize(f.copied), "wait for a parameter H2D");
      f.pin = {};
      if (!s) return fail(std::move(s));
    }
    const int key = next_key_++;
    auto dev = fetch_layer(key, shard);
    // Recorded after whatever of the fetch was enqueued on the copy stream, failed or not, so
    // the pin is never released under a copy that is still reading it.
    Status rec = cu(cudaEventRecord(f.copied, pipeline_->copy_stream()), "record parameter H2D");
    const size_t shard_bytes = shard.floats * (bf16_ ? sizeof(uint16_t) : sizeof(float));
    f.pin = std::move(shard);
    if (!dev) return fail(dev.error());
    h2d_bytes_ += shard_bytes;
    if (!rec) return fail(std::move(rec));
    open_.push_back(key);
    return *dev;
  }

  uint64_t h2d_bytes() const override { return h2d_bytes_; }

  // The pipeline call for the store's precision and the backend's: a bf16 layer as it was
  // gathered, one widened into fp32, or an fp32 one.
  Result<LayerParams> fetch_layer(int key, const Pinned& shard) {
    if (bf16_ && bf16_compute_) {
      auto p = pipeline_->fetch_bf16_layer(key, std::span<const uint16_t>(shard.bf16(), shard.floats));
      if (!p) return fail(p.error());
      return LayerParams::of_bf16(*p);
    }
    auto p = bf16_ ? pipeline_->fetch_bf16(key, std::span<const uint16_t>(shard.bf16(), shard.floats))
                   : pipeline_->fetch(key, std::span<const float>(shard.data, shard.floats));
    if (!p) return fail(p.error());
    return LayerParams(*p);
  }

  Status done_with_oldest() override {
    if (open_.empty()) return Status(Code::kInvalidArgument, "done_with_oldest: no fetch open");
    const int key = open_.front();
    open_.pop_front();
    return pipeline_->done_with(key);
  }

  Result<float*> grad_buffer(int layer) override {
    if (!pipeline_) return fail(Code::kInvalidArgument, "pipeline stream not opened");
    if (layer < 0 || static_cast<size_t>(layer) >= shard_.size())
      return fail(Code::kInvalidArgument, "grad_buffer: no layer " + std::to_string(layer));
    if (layer == 0) {
      // The compute stream orders this after the previous pass's copy out of g0_.
      Status s = cu(cudaMemsetAsync(g0_, 0, g0_floats_ * sizeof(float), compute_), "zero layer 0 gradient");
      if (!s) return fail(std::move(s));
      return g0_;
    }
    if (open_grad_ >= 0) return fail(Code::kInvalidArgument, "grad_buffer: another block's gradient is open");
    const int key = next_key_++;
    auto g = pipeline_->grad_buffer(key, shard_[layer]);
    if (!g) return fail(g.error());
    open_grad_ = layer;
    open_grad_key_ = key;
    return *g;
  }

  Status push_grad(int layer, Pinned shard, double* sumsq) override {
    if (!pipeline_) return Status(Code::kInvalidArgument, "pipeline stream not opened");
    if (layer < 0 || static_cast<size_t>(layer) >= shard_.size() || shard.floats != shard_[layer])
      return Status(Code::kInvalidArgument, "push_grad: shard does not match the layer's geometry");
    int key = open_grad_key_;
    if (layer == 0) {
      key = next_key_++;
      auto slot = pipeline_->grad_buffer(key, shard_[0]);
      if (!slot) return slot.error();
      TIER_RETURN_IF_ERROR(
          cu(cudaMemcpyAsync(*slot, g0_, g0_floats_ * sizeof(float), cudaMemcpyDeviceToDevice, compute_),
             "copy layer 0 gradient"));
    } else if (layer != open_grad_) {
      return Status(Code::kInvalidArgument,
                    "push_grad: layer " + std::to_string(layer) + " has no open gradient");
    } else {
      open_grad_ = -1;
    }
    auto t = bf16_ ? pipeline_->push_grad_bf16(key, std::span<uint16_t>(shard.bf16(), shard.floats))
                   : pipeline_->push_grad(key, std::span<float>(shard.data, shard.floats));
    if (!t) {
      // Part of the copy may have been enqueued: keep the pin until the device is idle.
      orphans_.push_back(std::move(shard));
      return t.error();
    }
    pending_.push_back({std::move(*t), std::move(shard), sumsq, bf16_});
    // Release the pins whose copies are done, oldest first (they complete in push order).
    while (!pending_.empty() && pending_.front().copy.done()) {
      TIER_RETURN_IF_ERROR(settle(pending_.front()));
      pending_.pop_front();
    }
    return Status::ok();
  }

  Status finish() override {
    Status first;
    auto keep = [&first](Status s) {
      if (first.is_ok() && !s.is_ok()) first = std::move(s);
    };
    for (Fetch& f : fetches_)
      if (f.pin.data != nullptr) {
        keep(cu(cudaEventSynchronize(f.copied), "wait for a parameter H2D"));
        f.pin = {};
      }
    for (Grad& g : pending_) keep(settle(g));
    pending_.clear();
    if (!orphans_.empty()) {
      keep(cu(cudaDeviceSynchronize(), "synchronize after a failed gradient push"));
      orphans_.clear();
    }
    open_.clear();
    open_grad_ = -1;
    return first;
  }

 private:
  struct Fetch {
    cudaEvent_t copied = nullptr;  // on the copy stream, after this position's last H2D
    Pinned pin;                    // that H2D's source
  };
  struct Grad {
    tier::gpu::Transfer copy;  // D2H into `pin`
    Pinned pin;
    double* sumsq = nullptr;
    bool bf16 = false;  // the shard holds bf16 values
  };

  // Waits for the gradient's D2H, takes its sum of squares, releases its pin.
  static Status settle(Grad& g) {
    Status s = g.copy.wait();
    if (s.is_ok() && g.sumsq != nullptr)
      *g.sumsq =
          g.bf16 ? sum_squares_bf16(g.pin.bf16(), g.pin.floats) : sum_squares(g.pin.data, g.pin.floats);
    g.pin = {};
    return s;
  }

  std::unique_ptr<NcclComm> nccl_;
  cudaStream_t compute_ = nullptr;  // the backend's; not owned
  int device_ = 0, ranks_ = 1;
  bool bf16_compute_ = false;  // the backend computes from bf16 layers
  bool bf16_ = false;          // --precision bf16: parameter and gradient shards hold bf16 values
  std::unique_ptr<tier::gpu::Stager> stager_;
  std::unique_ptr<LayerPipeline> pipeline_;
  std::vector<size_t> shard_;   // floats per rank, per layer
  std::vector<Fetch> fetches_;  // ring of depth positions, in fetch order
  size_t next_fetch_ = 0;
  std::deque<int> open_;  // pipeline keys of the fetches not yet done_with, oldest first
  // Every fetch and gradient slot gets its own pipeline key (the pipeline finds a slot by it),
  // so a layer used twice in flight (layer 0) never names the wrong slot.
  int next_key_ = 0;
  int open_grad_ = -1, open_grad_key_ = -1;  // the open block gradient, if any
  float* g0_ = nullptr;                      // layer 0's gradient (ranks x shard_[0] floats)
  size_t g0_floats_ = 0;
  std::deque<Grad> pending_;     // pushed gradients whose D2H may still run, in push order
  std::vector<Pinned> orphans_;  // pins of failed pushes, released after a device sync
  uint64_t h2d_bytes_ = 0;       // parameter bytes fetch() enqueued host to device
};

}  // namespace

Result<std::unique_ptr<LayerStream>> make_pipeline_stream(Backend& backend, Comm& comm) {
  auto* compute = static_cast<cudaStream_t>(backend_stream(backend));
  if (compute == nullptr)
    return fail(Code::kInvalidArgument, "the NCCL pipeline needs the CUDA backend (--backend cuda)");
  int device = 0;
  if (Status s = cu(cudaGetDevice(&device), "cudaGetDevice"); !s) return fail(std::move(s));
  std::unique_ptr<NcclComm> nccl;
  if (comm.size() > 1) {
    auto n = NcclComm::create(comm.rank(), comm.size(), device,
                              [&comm](void* data, size_t bytes) { return comm.broadcast(data, bytes, 0); });
    if (!n) return fail(n.error());
    nccl = std::move(*n);
  }
  return std::unique_ptr<LayerStream>(
      std::make_unique<PipelineStream>(std::move(nccl), compute, device, comm.size(), backend.bf16_params()));
}

}  // namespace tier::train::cuda
