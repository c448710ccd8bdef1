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

template <class T> Status device_alloc(T** p, size_t n, const char* what) {
  return cu(cudaMalloc(reinterpret_cast<void**>(p), n * sizeof(T)), what);
}

}  // namespace

// One ring slot: device buffers and the events that say when they may be reused.
struct Slot {
  int layer = -1;
  float* shard = nullptr;          // shard_floats
  float* full = nullptr;           // ranks * shard_floats
  uint16_t* shard16 = nullptr;     // bf16 pipelines: shard_floats bf16 values
  uint16_t* full16 = nullptr;      // bf16 pipelines: ranks * shard_floats bf16 values
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
  float* opt_buf = nullptr;   // p | m | v | g for the GPU optimizer, 4 × shard_floats
  uint16_t* opt16 = nullptr;  // bf16 g | bf16 working p for adamw_bf16, 2 × shard_floats

  ~Impl() {
    for (cudaStream_t s : {copy, comm_stream, d2h, compute})
      if (s) (void)cudaStreamSynchronize(s);
    for (auto* ring : {&params, &grads})
      for (Slot& s : *ring) {
        if (s.shard) (void)cudaFree(s.shard);
        if (s.full) (void)cudaFree(s.full);
        if (s.shard16) (void)cudaFree(s.shard16);
        if (s.full16) (void)cudaFree(s.full16);
        if (s.gathered) (void)cudaEventDestroy(s.gathered);
        if (s.consumed) (void)cudaEventDestroy(s.consumed);
      }
    if (opt_buf) (void)cudaFree(opt_buf);
    if (opt16) (void)cudaFree(opt16);
    for (cudaStream_t s : {copy, comm_stream, d2h})
      if (s) (void)cudaStreamDestroy(s);
  }

  // A compute_bf16 pipeline moves only bf16 layers: its parameter slots have no fp32 buffers
  // and its gradient slots no fp32 shard (the reduce-scatter is bf16), only the fp32 layer the
  // backward accumulates into.
  Status make_slot(Slot& s, bool param) {
    const size_t n = opts.shard_floats;
    const bool only_bf16 = opts.bf16 && opts.compute_bf16;
    if (!only_bf16) TIER_RETURN_IF_ERROR(device_alloc(&s.shard, n, "cudaMalloc shard"));
    if (!(only_bf16 && param)) TIER_RETURN_IF_ERROR(device_alloc(&s.full, n * ranks, "cudaMalloc layer"));
    if (opts.bf16) {
      TIER_RETURN_IF_ERROR(device_alloc(&s.shard16, n, "cudaMalloc bf16 shard"));
      TIER_RETURN_IF_ERROR(device_alloc(&s.full16, n * ranks, "cudaMalloc bf16 layer"));
    }
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

  // fetch / fetch_bf16 / fetch_bf16_layer: `shard` holds `count` elements, fp32 or (bf16)
  // bf16; the slot's layer buffer the compute reads: fp32 `full`, or `full16` when !widen.
  Result<Slot*> fetch(int layer, std::span<const std::byte> shard, size_t count, bool bf16, bool widen) {
    if (count > opts.shard_floats)
      return fail(Code::kInvalidArgument, "shard larger than the pipeline's shard_floats");
    if (bf16 && !opts.bf16) return fail(Code::kInvalidArgument, "a bf16 fetch on a pipeline made for fp32");
    if (!bf16 && opts.compute_bf16)
      return fail(Code::kInvalidArgument, "an fp32 fetch on a compute_bf16 pipeline");
    if (bf16 && widen == opts.compute_bf16)
      return fail(Code::kInvalidArgument, opts.compute_bf16
                                              ? "fetch_bf16 on a compute_bf16 pipeline (fetch_bf16_layer)"
                                              : "fetch_bf16_layer on a pipeline that widens (compute_bf16)");
    Slot& s = params[next_param++ % params.size()];
    s.layer = layer;
    // The copy may overwrite the slot only after the compute that read it was enqueued earlier
    // and has run: wait for `consumed` (and for the previous gather out of `shard`).
    TRY_RESULT(cu(cudaStreamWaitEvent(copy, s.consumed, 0), "wait consumed"));
    TRY_RESULT(cu(cudaStreamWaitEvent(copy, s.gathered, 0), "wait gathered"));
    const bool gather = comm && ranks > 1;
    // One rank: the shard is the layer, so the H2D goes straight into the layer buffer.
    void* dst = bf16 ? static_cast<void*>(gather ? s.shard16 : s.full16) : (gather ? s.shard : s.full);
    auto t = stager->copy_to_device(shard, dst, copy);
    if (!t) return fail(t.error());
    cudaStream_t last = copy;  // the stream whose work completes the layer
    if (gather) {
      TRY_RESULT(cu(cudaStreamWaitEvent(comm_stream, t->event(), 0), "wait h2d"));
      TRY_RESULT(bf16 ? comm->all_gather_bf16(s.shard16, s.full16, count, comm_stream)
                      : comm->all_gather(s.shard, s.full, count, comm_stream));
      last = comm_stream;
    }
    if (bf16 && widen)
      TRY_RESULT(cu(bf16_to_f32(s.full, s.full16, count * static_cast<size_t>(gather ? ranks : 1), last),
                    "widen bf16 layer"));
    TRY_RESULT(cu(cudaEventRecord(s.gathered, last), "record gathered"));
    TRY_RESULT(cu(cudaStreamWaitEvent(compute, s.gathered, 0), "wait for gather"));
    return &s;
  }

  // adamw / adamw_bf16: g holds p.size() fp32 or (g_bf16) bf16 values. The bf16 working copy
  // goes to the device pointer `working_dev` (fp32 g) or back to the host span `working` (bf16 g).
  Status adamw(std::span<float> p, std::span<float> mo, std::span<float> v, std::span<const std::byte> g,
               bool g_bf16, const AdamW& h, uint16_t* working_dev, std::span<uint16_t> working) {
    const size_t n = p.size();
    if (mo.size() != n || v.size() != n)
      return Status(Code::kInvalidArgument, "adamw: p, m, v, g differ in length");
    if (n > opts.shard_floats)
      return Status(Code::kInvalidArgument, "adamw: shard larger than the pipeline's shard_floats");
    if (!opt_buf) TIER_RETURN_IF_ERROR(device_alloc(&opt_buf, 4 * opts.shard_floats, "cudaMalloc"));
    if (g_bf16 && !opt16) TIER_RETURN_IF_ERROR(device_alloc(&opt16, 2 * opts.shard_floats, "cudaMalloc"));
    float *dp = opt_buf, *dm = dp + n, *dv = dm + n, *dg = dv + n;
    uint16_t *dg16 = opt16, *dw16 = g_bf16 ? opt16 + n : working_dev;
    std::vector<tier::gpu::Transfer> in;
    for (auto [src, dst] : {std::pair{bytes_of(p), static_cast<void*>(dp)},
                            {bytes_of(mo), dm},
                            {bytes_of(v), dv},
                            {g, g_bf16 ? static_cast<void*>(dg16) : dg}}) {
      auto t = stager->copy_to_device(src, dst, copy);
      if (!t) return t.error();
      in.push_back(std::move(*t));
    }
    TIER_RETURN_IF_ERROR(cu(cudaStreamWaitEvent(compute, in.back().event(), 0), "wait H2D"));
    if (g_bf16) TIER_RETURN_IF_ERROR(cu(bf16_to_f32(dg, dg16, n, compute), "widen bf16 gradient"));
    TIER_RETURN_IF_ERROR(cu(cuda::adamw(dp, dg, dm, dv, dw16, n, h, compute), "adamw"));
    cudaEvent_t done = nullptr;
    TIER_RETURN_IF_ERROR(cu(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"));
    Status st = cu(cudaEventRecord(done, compute), "record adamw");
    if (st) st = cu(cudaStreamWaitEvent(d2h, done, 0), "wait adamw");
    (void)cudaEventDestroy(done);
    TIER_RETURN_IF_ERROR(st);
    std::vector<std::pair<const void*, std::span<std::byte>>> back = {
        {dp, std::as_writable_bytes(p)}, {dm, std::as_writable_bytes(mo)}, {dv, std::as_writable_bytes(v)}};
    if (g_bf16) back.emplace_back(dw16, std::as_writable_bytes(working));
    std::vector<tier::gpu::Transfer> out;
    for (auto [src, dst] : back) {
      auto t = stager->copy_to_host(src, dst, d2h);
      if (!t) return t.error();
      out.push_back(std::move(*t));
    }
    return out.back().wait();  // in order on one stream: the last one done means all are
  }

  // push_grad / push_grad_bf16: `shard` receives `count` elements, fp32 or (bf16) bf16.
  Result<tier::gpu::Transfer> push_grad(int layer, std::span<std::byte> shard, size_t count, bool bf16) {
    if (bf16 && !opts.bf16)
      return fail(Code::kInvalidArgument, "a bf16 gradient on a pipeline made for fp32");
    if (!bf16 && opts.compute_bf16)
      return fail(Code::kInvalidArgument, "an fp32 gradient on a compute_bf16 pipeline");
    Slot* s = find(grads, layer);
    if (!s) return fail(Code::kNotFound, "no gradient buffer for layer " + std::to_string(layer));
    const bool reduce = comm && ranks > 1;
    if (bf16)
      TRY_RESULT(cu(f32_to_bf16(s->full16, s->full, count * static_cast<size_t>(ranks), compute),
                    "round gradient to bf16"));
    TRY_RESULT(cu(cudaEventRecord(s->gathered, compute), "record grads ready"));
    const void* src = bf16 ? static_cast<const void*>(s->full16) : s->full;
    if (reduce) {
      TRY_RESULT(cu(cudaStreamWaitEvent(comm_stream, s->gathered, 0), "wait grads"));
      TRY_RESULT(bf16 ? comm->reduce_scatter_bf16(s->full16, s->shard16, count, comm_stream)
                      : comm->reduce_scatter(s->full, s->shard, count, comm_stream));
      TRY_RESULT(cu(cudaEventRecord(s->gathered, comm_stream), "record reduced"));
      src = bf16 ? static_cast<const void*>(s->shard16) : s->shard;
    }
    TRY_RESULT(cu(cudaStreamWaitEvent(d2h, s->gathered, 0), "wait reduce-scatter"));
    auto t = stager->copy_to_host(src, shard, d2h);
    if (!t) return fail(t.error());
    TRY_RESULT(cu(cudaEventRecord(s->consumed, d2h), "record grad slot free"));
    return t;
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
      Status st = impl->make_slot(s, ring == &impl->params);
      if (!st) return fail(std::move(st));
    }
  return std::unique_ptr<LayerPipeline>(new LayerPipeline(std::move(impl)));
}

Result<float*> LayerPipeline::fetch(int layer, std::span<const float> shard) {
  auto s = impl_->fetch(layer, bytes_of(shard), shard.size(), false, false);
  if (!s) return fail(s.error());
  return (*s)->full;
}

Result<float*> LayerPipeline::fetch_bf16(int layer, std::span<const uint16_t> shard) {
  auto s = impl_->fetch(layer, std::as_bytes(shard), shard.size(), true, true);
  if (!s) return fail(s.error());
  return (*s)->full;
}

Result<const uint16_t*> LayerPipeline::fetch_bf16_layer(int layer, std::span<const uint16_t> shard) {
  auto s = impl_->fetch(layer, std::as_bytes(shard), shard.size(), true, false);
  if (!s) return fail(s.error());
  return (*s)->full16;
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
  return impl_->push_grad(layer, std::as_writable_bytes(shard), shard.size(), false);
}

Result<tier::gpu::Transfer> LayerPipeline::push_grad_bf16(int layer, std::span<uint16_t> shard) {
  return impl_->push_grad(layer, std::as_writable_bytes(shard), shard.size(), true);
}

Status LayerPipeline::adamw(std::span<float> p, std::span<float> mo, std::span<float> v,
                            std::span<const float> g, const AdamW& h, uint16_t* working_bf16) {
  if (g.size() != p.size()) return Status(Code::kInvalidArgument, "adamw: p, m, v, g differ in length");
  return impl_->adamw(p, mo, v, std::as_bytes(g), false, h, working_bf16, {});
}

Status LayerPipeline::adamw_bf16(std::span<float> p, std::span<float> mo, std::span<float> v,
                                 std::span<const uint16_t> g, const AdamW& h, std::span<uint16_t> working) {
  if (g.size() != p.size() || working.size() != p.size())
    return Status(Code::kInvalidArgument, "adamw: p, m, v, g and the working copy differ in length");
  return impl_->adamw(p, mo, v, std::as_bytes(g), true, h, nullptr, working);
}

cudaStream_t LayerPipeline::copy_stream() const { return impl_->copy; }
cudaStream_t LayerPipeline::comm_stream() const { return impl_->comm_stream; }

}  // namespace tier::train::cuda
