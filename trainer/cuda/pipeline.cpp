#include "trainer/cuda/pipeline.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "cuda_status.hpp"
#include "wire/errors.hpp"

namespace tier::train::cuda {
namespace {

// CUDA errors become Status in one place (cuda/cuda_status.hpp).
Status cu(cudaError_t e, const char* what) { return tier::gpu::check_cuda(e, what); }

// TIER_RETURN_IF_ERROR for functions that return a Result.
#define TRY_RESULT(expr)                                                   \
  do {                                                                     \
    ::tier::Status try_status_ = (expr);                                   \
    if (!try_status_.is_ok()) return ::tier::fail(std::move(try_status_)); \
  } while (0)

std::span<const std::byte> bytes_of(std::span<const float> s) { return std::as_bytes(s); }

}  // namespace

// One ring slot: device buffers and the events that say when they may be reused.
struct Slot {
  int layer = -1;
  float* shard = nullptr;          // shard_floats
  float* full = nullptr;           // ranks * shard_floats
  cudaEvent_t gathered = nullptr;  // comm: full layer is in `full`
  cudaEvent_t consumed = nullptr;  // compute: last kernel reading `full` was enqueued before it
};

struct LayerPipeline::Impl {
  tier::gpu::Stager* stager = nullptr;
  NcclComm* comm = nullptr;
  cudaStream_t compute = nullptr, copy = nullptr, comm_stream = nullptr, d2h = nullptr;
  PipelineOptions opts;
  int ranks = 1;
  std::vector<Slot> params, grads;
  size_t next_param = 0, next_grad = 0;
  float* opt_buf = nullptr;  // p | m | v | g for the GPU optimizer, 4 × shard_floats

  ~Impl() {
    for (cudaStream_t s : {copy, comm_stream, d2h, compute})
      if (s) (void)cudaStreamSynchronize(s);
    for (auto* ring : {&params, &grads})
      for (Slot& s : *ring) {
        if (s.shard) (void)cudaFree(s.shard);
        if (s.full) (void)cudaFree(s.full);
        if (s.gathered) (void)cudaEventDestroy(s.gathered);
        if (s.consumed) (void)cudaEventDestroy(s.consumed);
      }
    if (opt_buf) (void)cudaFree(opt_buf);
    for (cudaStream_t s : {copy, comm_stream, d2h})
      if (s) (void)cudaStreamDestroy(s);
  }

  Status make_slot(Slot& s) {
    const size_t n = opts.shard_floats;
    TIER_RETURN_IF_ERROR(
        cu(cudaMalloc(reinterpret_cast<void**>(&s.shard), n * sizeof(float)), "cudaMalloc shard"));
    TIER_RETURN_IF_ERROR(
        cu(cudaMalloc(reinterpret_cast<void**>(&s.full), n * ranks * sizeof(float)), "cudaMalloc layer"));
    TIER_RETURN_IF_ERROR(
        cu(cudaEventCreateWithFlags(&s.gathered, cudaEventDisableTiming), "cudaEventCreate"));
    TIER_RETURN_IF_ERROR(
        cu(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming), "cudaEventCreate"));
    // Both events start "complete" so the first use of a slot waits for nothing.
    TIER_RETURN_IF_ERROR(cu(cudaEventRecord(s.gathered, compute), "cudaEventRecord"));
    return cu(cudaEventRecord(s.consumed, compute), "cudaEventRecord");
  }

  Slot* find(std::vector<Slot>& ring, int layer) {
    for (Slot& s : ring)
      if (s.layer == layer) return &s;
    return nullptr;
  }
};

LayerPipeline::LayerPipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LayerPipeline::~LayerPipeline() = default;

Result<std::unique_ptr<LayerPipeline>> LayerPipeline::create(tier::gpu::Stager& stager, NcclComm* comm,
                                                             cudaStream_t compute, const PipelineOptions& o) {
  if (o.shard_floats == 0 || o.depth < 1)
    return fail(Code::kInvalidArgument, "pipeline needs shard_floats > 0 and depth >= 1");
  auto impl = std::make_unique<Impl>();
  impl->stager = &stager;
  impl->comm = comm;
  impl->compute = compute;
  impl->opts = o;
  impl->ranks = comm ? comm->size() : 1;
  if (cudaSetDevice(stager.device()) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(Code::kUnsupported, "no CUDA device: cudaSetDevice failed");
  }
  for (cudaStream_t* s : {&impl->copy, &impl->comm_stream, &impl->d2h}) {
    Status st = cu(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!st) return fail(std::move(st));
  }
  impl->params.resize(o.depth);
  impl->grads.resize(o.depth);
  for (auto* ring : {&impl->params, &impl->grads})
    for (Slot& s : *ring) {
      Status st = impl->make_slot(s);
      if (!st) return fail(std::move(st));
    }
  return std::unique_ptr<LayerPipeline>(new LayerPipeline(std::move(impl)));
}

Result<float*> LayerPipeline::fetch(int layer, std::span<const float> shard) {
  Impl& m = *impl_;
  if (shard.size() > m.opts.shard_floats)
    return fail(Code::kInvalidArgument, "shard larger than the pipeline's shard_floats");
  Slot& s = m.params[m.next_param++ % m.params.size()];
  s.layer = layer;
  // The copy may overwrite the slot only after the compute that read it was enqueued earlier
  // and has run: wait for `consumed` (and for the previous gather out of `shard`).
  TRY_RESULT(cu(cudaStreamWaitEvent(m.copy, s.consumed, 0), "wait consumed"));
  TRY_RESULT(cu(cudaStreamWaitEvent(m.copy, s.gathered, 0), "wait gathered"));
  float* full = s.full;
  const bool gather = m.comm && m.ranks > 1;
  // One rank: the shard is the layer, so the H2D goes straight into `full`.
  auto t = m.stager->copy_to_device(bytes_of(shard), gather ? s.shard : s.full, m.copy);
  if (!t) return fail(t.error());
  if (gather) {
    TRY_RESULT(cu(cudaStreamWaitEvent(m.comm_stream, t->event(), 0), "wait h2d"));
    TRY_RESULT(m.comm->all_gather(s.shard, s.full, shard.size(), m.comm_stream));
    TRY_RESULT(cu(cudaEventRecord(s.gathered, m.comm_stream), "record gathered"));
  } else {
    TRY_RESULT(cu(cudaEventRecord(s.gathered, m.copy), "record gathered"));
  }
  TRY_RESULT(cu(cudaStreamWaitEvent(m.compute, s.gathered, 0), "wait for gather"));
  return full;
}

Status LayerPipeline::done_with(int layer) {
  Slot* s = impl_->find(impl_->params, layer);
  if (!s) return Status(Code::kNotFound, "layer " + std::to_string(layer) + " is not in flight");
  return cu(cudaEventRecord(s->consumed, impl_->compute), "record consumed");
}

Result<float*> LayerPipeline::grad_buffer(int layer, size_t shard_floats) {
  Impl& m = *impl_;
  if (shard_floats > m.opts.shard_floats)
    return fail(Code::kInvalidArgument, "shard larger than the pipeline's shard_floats");
  Slot& s = m.grads[m.next_grad++ % m.grads.size()];
  s.layer = layer;
  // `consumed` of a grad slot: the reduce-scatter that last read `full` and the D2H that last
  // read `shard` are complete.
  TRY_RESULT(cu(cudaStreamWaitEvent(m.compute, s.consumed, 0), "wait grad slot"));
  TRY_RESULT(cu(cudaMemsetAsync(s.full, 0, shard_floats * m.ranks * sizeof(float), m.compute), "zero grads"));
  return s.full;
}

Result<tier::gpu::Transfer> LayerPipeline::push_grad(int layer, std::span<float> shard) {
  Impl& m = *impl_;
  Slot* s = m.find(m.grads, layer);
  if (!s) return fail(Code::kNotFound, "no gradient buffer for layer " + std::to_string(layer));
  TRY_RESULT(cu(cudaEventRecord(s->gathered, m.compute), "record grads ready"));
  const float* src = s->full;
  if (m.comm && m.ranks > 1) {
    TRY_RESULT(cu(cudaStreamWaitEvent(m.comm_stream, s->gathered, 0), "wait grads"));
    TRY_RESULT(m.comm->reduce_scatter(s->full, s->shard, shard.size(), m.comm_stream));
    TRY_RESULT(cu(cudaEventRecord(s->gathered, m.comm_stream), "record reduced"));
    src = s->shard;
  }
  TRY_RESULT(cu(cudaStreamWaitEvent(m.d2h, s->gathered, 0), "wait reduce-scatter"));
  auto t = m.stager->copy_to_host(src, std::as_writable_bytes(shard), m.d2h);
  if (!t) return fail(t.error());
  TRY_RESULT(cu(cudaEventRecord(s->consumed, m.d2h), "record grad slot free"));
  return t;
}

Status LayerPipeline::adamw(std::span<float> p, std::span<float> mo, std::span<float> v,
                            std::span<const float> g, const AdamW& h, uint16_t* working_bf16) {
  Impl& m = *impl_;
  const size_t n = p.size();
  if (mo.size() != n || v.size() != n || g.size() != n)
    return Status(Code::kInvalidArgument, "adamw: p, m, v, g differ in length");
  if (n > m.opts.shard_floats)
    return Status(Code::kInvalidArgument, "adamw: shard larger than the pipeline's shard_floats");
  if (!m.opt_buf)
    TIER_RETURN_IF_ERROR(
        cu(cudaMalloc(reinterpret_cast<void**>(&m.opt_buf), 4 * m.opts.shard_floats * sizeof(float)),
           "cudaMalloc"));
  float *dp = m.opt_buf, *dm = dp + n, *dv = dm + n, *dg = dv + n;
  std::vector<tier::gpu::Transfer> in;
  for (auto [src, dst] : {std::pair{std::span<const float>(p), dp},
                          {std::span<const float>(mo), dm},
                          {std::span<const float>(v), dv},
                          {g, dg}}) {
    auto t = m.stager->copy_to_device(bytes_of(src), dst, m.copy);
    if (!t) return t.error();
    in.push_back(std::move(*t));
  }
  TIER_RETURN_IF_ERROR(cu(cudaStreamWaitEvent(m.compute, in.back().event(), 0), "wait H2D"));
  TIER_RETURN_IF_ERROR(cu(cuda::adamw(dp, dg, dm, dv, working_bf16, n, h, m.compute), "adamw"));
  cudaEvent_t done = nullptr;
  TIER_RETURN_IF_ERROR(cu(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"));
  Status st = cu(cudaEventRecord(done, m.compute), "record adamw");
  if (st) st = cu(cudaStreamWaitEvent(m.d2h, done, 0), "wait adamw");
  (void)cudaEventDestroy(done);
  TIER_RETURN_IF_ERROR(st);
  std::vector<tier::gpu::Transfer> out;
  for (auto [src, dst] : {std::pair{static_cast<const float*>(dp), p}, {dm, mo}, {dv, v}}) {
    auto t = m.stager->copy_to_host(src, std::as_writable_bytes(dst), m.d2h);
    if (!t) return t.error();
    out.push_back(std::move(*t));
  }
  return out.back().wait();  // in order on one stream: the last one done means all are
}

cudaStream_t LayerPipeline::copy_stream() const { return impl_->copy; }
cudaStream_t LayerPipeline::comm_stream() const { return impl_->comm_stream; }

}  // namespace tier::train::cuda
