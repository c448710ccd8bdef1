#include "trainer/trainer.hpp"

#include "trainer/dump.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <future>
#include <mutex>

namespace tier::train {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

enum class UseKind { kEmbedFwd, kBlockFwd, kHead, kBlockBwd, kEmbedBwd };
struct Use {
  UseKind kind;
  int layer;
};

// The sequence of layer uses of one training step (grad) or one forward pass (eval).
std::vector<Use> step_uses(int L, bool grad) {
  std::vector<Use> u;
  u.push_back({UseKind::kEmbedFwd, 0});
  for (int l = 1; l <= L; ++l) u.push_back({UseKind::kBlockFwd, l});
  u.push_back({UseKind::kHead, 0});
  if (!grad) return u;
  for (int l = L; l >= 1; --l) u.push_back({UseKind::kBlockBwd, l});
  u.push_back({UseKind::kEmbedBwd, 0});
  return u;
}

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Device buffers of one rank, sized for B sequences of T tokens.
struct Buffers {
  Backend* be = nullptr;
  std::vector<float*> owned;
  std::vector<float*> slots;         // K+1 gathered layers [max_pad]
  std::vector<float*> slots_host;    // host staging when the backend is not host-accessible
  float* g0 = nullptr;               // layer 0 gradient [pad0]
  float* gblk[2] = {nullptr, nullptr};  // block gradients [pad1], alternating
  std::vector<float*> g_host;        // staging for g0, gblk[0], gblk[1]
  std::vector<float*> xs;            // residual stream x_0..x_L [B,T,C]
  std::vector<float*> acts;          // per block [block_acts_floats]
  float* head = nullptr;
  float* scratch = nullptr;
  float* dx = nullptr;
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  // Host staging for a backend that is not host-accessible: page-aligned and pinned through
  // the backend (CUDA: cudaHostRegister) so upload/download are DMA; unpinned before freeing.
  struct HostBuf {
    float* p = nullptr;
    bool pinned = false;
  };
  std::vector<HostBuf> host_owned;

  ~Buffers() {
    for (float* p : owned) be->free(p);
    if (tokens) be->free_tokens(tokens);
    if (targets) be->free_tokens(targets);
    for (HostBuf& h : host_owned) {
      if (h.pinned) be->unpin_host(h.p);
      std::free(h.p);
    }
  }
  float* dev(size_t n) {
    float* p = be->alloc(std::max<size_t>(n, 1));
    if (p) owned.push_back(p);
    return p;
  }
  // nullptr when out of memory.
  float* host(size_t n) {
    const size_t bytes = round_up(std::max<size_t>(n, 1) * sizeof(float), 4096);
    auto* p = static_cast<float*>(std::aligned_alloc(4096, bytes));
    if (p == nullptr) return nullptr;
    std::memset(p, 0, bytes);
    host_owned.push_back({p, be->pin_host(p, bytes)});
    return p;
  }
};

}  // namespace

uint64_t run_config_hash(const TrainOptions& o, int ranks) {
  uint64_t h = 0x5eed;
  for (uint64_t v : {uint64_t(o.model.layers), uint64_t(o.model.dim), uint64_t(o.model.heads),
                     uint64_t(o.model.seq), uint64_t(o.model.vocab), uint64_t(ranks),
                     uint64_t(o.batch), uint64_t(o.seq), o.seed, uint64_t(o.buffers)})
    h = mix_seed(h, v);
  return h;
}

namespace {
// Whether this rank writes its daemon's commit marker: the lowest rank of those whose store's
// marker_domain() is this one's (compared by a 64-bit FNV-1a hash of it). Collective.
Result<bool> is_marker_writer(Comm& comm, const ShardStore& store) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : store.marker_domain()) h = (h ^ c) * 0x100000001b3ull;
  auto all = comm.allgather(h);
  if (!all) return fail(all.error());
  return std::find(all->begin(), all->begin() + comm.rank(), h) == all->begin() + comm.rank();
}
}  // namespace

Result<RunSummary> train(const TrainOptions& opts, const Dataset& data, Comm& comm, Backend& be,
                         ShardStore& store, std::FILE* out) {
  const ModelConfig& m = opts.model;
  if (auto s = validate(m); !s) return fail(s);
  const int R = comm.size(), rank = comm.rank();
  const int T = opts.seq > 0 ? opts.seq : m.seq;
  if (T > m.seq) return fail(Code::kInvalidArgument, fmt::format("--seq {} exceeds the model's {}", T, m.seq));
  if (opts.batch < R || opts.batch % R != 0)
    return fail(Code::kInvalidArgument,
                fmt::format("--batch {} must be a positive multiple of the rank count {}", opts.batch, R));
  if (opts.buffers != 1 && opts.buffers != 2) return fail(Code::kInvalidArgument, "buffers must be 1 or 2");
  const int Bg = opts.batch, B = Bg / R;
  const int L = m.layers, NL = m.num_layers();
  const int K = std::max(0, opts.prefetch);
  const Dims d = m.dims(B, T);
  const size_t BTC = static_cast<size_t>(B) * T * m.dim;

  // Shard geometry: padded so every shard is a whole number of 64-byte lines.
  std::vector<size_t> layer_n(NL), pad(NL), shard(NL);
  size_t max_pad = 0;
  for (int l = 0; l < NL; ++l) {
    layer_n[l] = m.layer_floats(l);
    pad[l] = round_up(layer_n[l], 16 * static_cast<size_t>(R));
    shard[l] = pad[l] / R;
    max_pad = std::max(max_pad, pad[l]);
  }
  StoreLayout layout;
  layout.rank = rank;
  layout.ranks = R;
  layout.local_rank = comm.local_rank();
  layout.gpu_pci = opts.gpu_pci;
  layout.buffers = opts.buffers;
  layout.shard_floats = shard;
  if (auto s = store.open(layout); !s) return fail(s);

  const uint64_t hash = run_config_hash(opts, R);
  int64_t start = 1;
  // One marker per daemon the job uses, whatever the host layout (two daemons on one host, or
  // one per node): its writer is the lowest rank whose state that daemon holds.
  auto writer = is_marker_writer(comm, store);
  if (!writer) return fail(writer.error());
  const bool marker_writer = *writer;
  if (opts.resume) {
    // Every rank reads its own daemon's marker; the job then agrees on one verdict, so a
    // rank whose daemon has none fails the job instead of leaving the others in a collective.
    auto mk = store.read_marker();
    const bool ok = mk && mk->magic == CommitMarker::kMagic && mk->config_hash == hash &&
                    mk->ranks == uint64_t(R);
    const double step = ok ? static_cast<double>(mk->step) : 0.0;
    double v[3] = {ok ? 0.0 : 1.0, step, -step};  // any marker bad, newest, -oldest
    if (auto st = comm.allreduce_max(v, 3); !st) return fail(st);
    if (!mk) return fail(mk.error());
    if (v[0] != 0.0)
      return fail(Code::kInvalidArgument,
                  "--resume: the job's state was not written by this model, rank count, batch and "
                  "seed (or no step was ever committed) in every daemon it uses");
    // A marker says step s only after every rank finished s; daemons whose marker writer died
    // between the barrier and its write say s - 1. Both buffers are intact then (see commit).
    // Markers further apart were not written by one run of this job (a daemon's pool rolled
    // back or replaced): no buffer holds one step for every rank.
    const auto newest = static_cast<int64_t>(v[1]), oldest = static_cast<int64_t>(-v[2]);
    if (newest - oldest > 1)
      return fail(Code::kInvalidArgument,
                  fmt::format("--resume: the daemons' commit markers say steps {} to {}; one run "
                              "leaves them at most one step apart, so no step is held by all",
                              oldest, newest));
    start = newest + 1;
  } else {
    // Invalidate the marker before overwriting the state, then initialize buffer 0.
    if (marker_writer) {
      if (auto s = store.write_marker(CommitMarker{}); !s) return fail(s);
    }
    if (auto s = comm.barrier(); !s) return fail(s);
    std::vector<float> full;
    for (int l = 0; l < NL; ++l) {
      full.assign(pad[l], 0.0f);
      init_layer(m, l, opts.seed, std::span<float>(full.data(), layer_n[l]));
      for (int b = 0; b < opts.buffers; ++b) {
        auto pv = store.acquire_many(std::vector<ShardRef>{{l, ShardKind::kParam, b},
                                                           {l, ShardKind::kM, b},
                                                           {l, ShardKind::kV, b}},
                                     Access::kOverwrite);
        if (!pv) return fail(pv.error());
        std::memcpy((*pv)[0].data, full.data() + rank * shard[l], shard[l] * sizeof(float));
        std::memset((*pv)[1].data, 0, shard[l] * sizeof(float));
        std::memset((*pv)[2].data, 0, shard[l] * sizeof(float));
      }
      auto g = store.acquire({l, ShardKind::kGrad, 0}, Access::kOverwrite);
      if (!g) return fail(g.error());
      std::memset(g->data, 0, shard[l] * sizeof(float));
    }
    if (auto s = comm.barrier(); !s) return fail(s);
    if (marker_writer) {
      CommitMarker mk{CommitMarker::kMagic, 0, uint64_t(R), hash};
      if (auto s = store.write_marker(mk); !s) return fail(s);
    }
    if (auto s = comm.barrier(); !s) return fail(s);
  }

  // Device buffers.
  Buffers buf;
  buf.be = &be;
  const bool host = be.host_accessible();
  // A LayerStream keeps the parameter slots and gradient buffers on the device itself.
  if (opts.stream == nullptr) {
    for (int i = 0; i <= K; ++i) {
      buf.slots.push_back(buf.dev(max_pad));
      buf.slots_host.push_back(host ? buf.slots.back() : buf.host(max_pad));
    }
    buf.g0 = buf.dev(pad[0]);
    const size_t pad_blk = NL > 1 ? pad[1] : 1;
    buf.gblk[0] = buf.dev(pad_blk);
    buf.gblk[1] = buf.dev(pad_blk);
    buf.g_host = host ? std::vector<float*>{buf.g0, buf.gblk[0], buf.gblk[1]}
                      : std::vector<float*>{buf.host(pad[0]), buf.host(pad_blk), buf.host(pad_blk)};
  } else if (auto s = opts.stream->open(store, shard, K + 1); !s) {
    return fail(s);
  }
  for (int l = 0; l <= L; ++l) buf.xs.push_back(buf.dev(BTC));
  for (int l = 0; l < L; ++l) buf.acts.push_back(buf.dev(block_acts_floats(d)));
  buf.head = buf.dev(head_acts_floats(d));
  buf.scratch = buf.dev(block_scratch_floats(d));
  buf.dx = buf.dev(BTC);
  buf.tokens = be.alloc_tokens(static_cast<size_t>(B) * T);
  buf.targets = be.alloc_tokens(static_cast<size_t>(B) * T);
  for (float* p : buf.owned)
    if (p == nullptr) return fail(Code::kResourceExhausted, "backend allocation failed");
  for (float* p : buf.slots_host)
    if (p == nullptr) return fail(Code::kResourceExhausted, "host staging allocation failed");
  for (float* p : buf.g_host)
    if (p == nullptr) return fail(Code::kResourceExhausted, "host staging allocation failed");
  if (!buf.tokens || !buf.targets) return fail(Code::kResourceExhausted, "backend allocation failed");
  std::vector<int32_t> tok_h(static_cast<size_t>(B) * T), tgt_h(tok_h.size());

  // Shards pinned by in-flight collectives; touched only on the comm thread.
  std::vector<Pinned> gather_pins(static_cast<size_t>(K) + 1), rs_pins(NL);
  std::vector<double> grad_sumsq(NL, 0.0);

  // The step's plan for tierd: param shards in gather order, grads in backward order (written
  // whole by the reduce-scatter: overwrites), then per layer the optimizer's inputs and, double
  // buffered, the other buffer it writes whole (overwrites). Registered for both buffers'
  // parity (it repeats every two steps). With --overlap-optimizer the update runs on its own
  // thread and lane (its own tierd client): the passes and the update are then two plans.
  const bool overlap_optimizer = opts.overlap_optimizer && opts.optimizer == nullptr;
  const Lane opt_lane = overlap_optimizer ? Lane::kOptimizer : Lane::kPass;
  {
    std::vector<ShardUse> plan, opt_plan;
    std::vector<ShardUse>& opt_uses = overlap_optimizer ? opt_plan : plan;
    const bool two = opts.buffers == 2;
    for (int b = 0; b < opts.buffers; ++b) {
      for (const Use& u : step_uses(L, true)) {
        plan.push_back({{u.layer, ShardKind::kParam, b}, false});
        if (u.kind == UseKind::kBlockBwd || u.kind == UseKind::kEmbedBwd)
          plan.push_back({{u.layer, ShardKind::kGrad, 0}, true});
      }
      for (int l = 0; l < NL; ++l) {
        for (ShardKind k : {ShardKind::kParam, ShardKind::kM, ShardKind::kV}) opt_uses.push_back({{l, k, b}, false});
        opt_uses.push_back({{l, ShardKind::kGrad, 0}, false});
        if (two)
          for (ShardKind k : {ShardKind::kParam, ShardKind::kM, ShardKind::kV})
            opt_uses.push_back({{l, k, 1 - b}, true});
      }
    }
    store.set_plan(plan, Lane::kPass);
    if (overlap_optimizer) store.set_plan(opt_plan, Lane::kOptimizer);
  }

  // --fault-step/--fault-point: SIGKILL this rank at a point of a step (restart tests).
  int64_t cur_step = 0;
  auto fault_at = [&](const char* point, int64_t step) {
    if (opts.fault_step == step && opts.fault_rank == rank && opts.fault_point == point)
      std::raise(SIGKILL);
  };
  auto fault = [&](const char* point) { fault_at(point, cur_step); };

  // The CPU optimizer of step s runs on its own thread while step s+1's pass starts. Layer l's
  // shards of buffer nxt are gathered, and its gradient overwritten by the next reduce-scatter,
  // only once the update of layer l is done: the passes wait on this progress (their wait
  // counts as stall). Thread-safety: every field under `mu`.
  struct OptProgress {
    std::mutex mu;
    std::condition_variable cv;
    int done = INT32_MAX;  // layers of the running update finished; all when none runs
    bool failed = false;
    void start() {
      std::lock_guard g(mu);
      done = 0;
      failed = false;
    }
    void layer_done(int l) {
      { std::lock_guard g(mu); done = l + 1; }
      cv.notify_all();
    }
    void finish(bool ok) {
      { std::lock_guard g(mu); done = INT32_MAX; failed = !ok; }
      cv.notify_all();
    }
    // False when the update failed (the pass must stop: the shard will not be written).
    bool wait_layer(int l) {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return failed || done > l; });
      return !failed;
    }
  } progress;
  const Status kOptFailed(Code::kInternal, "the previous step's optimizer failed (its error follows)");

  double stall_ms = 0;

  // Both pass implementations: the loss is a mean over the global batch's tokens, and a
  // forward use of the embedding or of a block reads only its parameters P.
  const float loss_scale = 1.0f / (static_cast<float>(Bg) * static_cast<float>(T));
  auto forward = [&](const Use& u, const float* P) {
    if (u.kind == UseKind::kEmbedFwd)
      be.embed_forward(d, P, buf.tokens, buf.xs[0]);
    else
      be.block_forward(d, P, buf.xs[u.layer - 1], carve_block_acts(buf.acts[u.layer - 1], d),
                       buf.xs[u.layer]);
  };

  // The pass through opts.stream (--collectives nccl): the stream copies, gathers and
  // reduce-scatters on the device; this thread pins the shards (waiting first, as the host
  // path's comm thread does, for the overlapped update of the layer) and hands the pins over.
  // Time spent pinning and in finish() counts as stall.
  auto run_stream_pass = [&](const std::vector<Use>& uses, int cur, bool grad) -> Result<double> {
    LayerStream& ls = *opts.stream;
    std::vector<float*> fetched(uses.size(), nullptr);
    auto pin = [&](const ShardRef& ref, Access access) -> Result<Pinned> {
      const auto t0 = Clock::now();
      if (!progress.wait_layer(ref.layer)) return fail(kOptFailed);
      auto p = store.acquire(ref, access);
      stall_ms += ms_since(t0);
      return p;
    };
    auto fetch = [&](size_t j) -> Status {
      if (K > 0 && j + K < uses.size())
        store.prefetch(std::vector<ShardRef>{{uses[j + K].layer, ShardKind::kParam, cur}});
      auto p = pin({uses[j].layer, ShardKind::kParam, cur}, Access::kRead);
      if (!p) return p.error();
      auto dev = ls.fetch(uses[j].layer, std::move(*p));
      if (!dev) return dev.error();
      fetched[j] = *dev;
      return {};
    };
    // The reduce-scatter writes every float of the shard: nothing to read back.
    auto push = [&](int layer) -> Status {
      auto p = pin({layer, ShardKind::kGrad, 0}, Access::kOverwrite);
      if (!p) return p.error();
      return ls.push_grad(layer, std::move(*p), &grad_sumsq[layer]);
    };
    auto body = [&]() -> Result<double> {
      for (size_t j = 0; j <= static_cast<size_t>(K) && j < uses.size(); ++j)
        if (auto s = fetch(j); !s) return fail(s);
      double loss = 0;
      float* g0 = nullptr;  // layer 0's gradient: open from the head to the embedding's backward
      for (size_t i = 0; i < uses.size(); ++i) {
        const Use u = uses[i];
        const float* P = fetched[i];
        switch (u.kind) {
          case UseKind::kEmbedFwd:
          case UseKind::kBlockFwd:
            forward(u, P);
            break;
          case UseKind::kHead:
            if (grad) {
              auto g = ls.grad_buffer(0);
              if (!g) return fail(g.error());
              g0 = *g;
            }
            loss += be.head_forward(d, P, buf.xs[L], buf.targets, carve_head_acts(buf.head, d),
                                    grad ? buf.dx : nullptr, g0, loss_scale);
            if (grad) fault("forward");
            break;
          case UseKind::kBlockBwd: {
            auto g = ls.grad_buffer(u.layer);
            if (!g) return fail(g.error());
            be.block_backward(d, P, *g, buf.xs[u.layer - 1],
                              carve_block_acts(buf.acts[u.layer - 1], d), buf.dx, buf.dx,
                              buf.scratch);
            if (auto s = push(u.layer); !s) return fail(s);
            if (u.layer == L) fault("backward");
            break;
          }
          case UseKind::kEmbedBwd:
            be.embed_backward(d, g0, buf.tokens, buf.dx);
            if (auto s = push(0); !s) return fail(s);
            break;
        }
        if (auto s = ls.done_with_oldest(); !s) return fail(s);
        if (i + K + 1 < uses.size())
          if (auto s = fetch(i + K + 1); !s) return fail(s);
      }
      return loss;
    };
    Result<double> loss = body();
    const auto t0 = Clock::now();
    Status s = ls.finish();  // also after a failure: drops the pins
    stall_ms += ms_since(t0);
    if (!loss) return loss;
    if (!s) return fail(s);
    return loss;
  };

  // One pass over `uses` with params from buffer `cur`. Returns the summed loss of this rank.
  auto run_pass = [&](const std::vector<Use>& uses, int cur, bool grad) -> Result<double> {
    if (opts.stream != nullptr) return run_stream_pass(uses, cur, grad);
    std::vector<Comm::Handle> gh(uses.size());
    std::vector<Comm::Handle> rsh(NL);
    auto issue_gather = [&](size_t j) {
      const size_t slot = j % (static_cast<size_t>(K) + 1);
      const int layer = uses[j].layer;
      const ShardRef ref{layer, ShardKind::kParam, cur};
      std::vector<ShardRef> hint;
      if (K > 0 && j + K < uses.size()) hint.push_back({uses[j + K].layer, ShardKind::kParam, cur});
      Comm::Op op;
      op.start = [&, ref, slot, layer, hint](Comm::Request& req) -> Status {
        if (!progress.wait_layer(layer)) return kOptFailed;
        if (!hint.empty()) store.prefetch(hint);
        auto p = store.acquire(ref, Access::kRead);
        if (!p) return p.error();
        gather_pins[slot] = std::move(*p);
        return comm.start_allgather(gather_pins[slot].data, buf.slots_host[slot], shard[layer], req);
      };
      op.finish = [&, slot] { gather_pins[slot].release(); };
      gh[j] = comm.submit(std::move(op));
    };
    auto issue_rs = [&](int layer, float* full_dev, float* full_host) {
      if (!host) {
        be.download(full_host, full_dev, pad[layer]);
      }
      Comm::Op op;
      op.start = [&, layer, full_host](Comm::Request& req) -> Status {
        if (!progress.wait_layer(layer)) return kOptFailed;  // it still reads the old gradient
        // The reduce-scatter writes every float of the shard: nothing to read back.
        auto p = store.acquire({layer, ShardKind::kGrad, 0}, Access::kOverwrite);
        if (!p) return p.error();
        rs_pins[layer] = std::move(*p);
        return comm.start_reduce_scatter(full_host, rs_pins[layer].data, shard[layer], req);
      };
      // The shard's squared norm is taken here, while the shard is still pinned, so the
      // optimizer's global-norm pass needs no second pin.
      op.finish = [&, layer] {
        if (rs_pins[layer].data != nullptr) grad_sumsq[layer] = sum_squares(rs_pins[layer].data, shard[layer]);
        rs_pins[layer].release();
      };
      rsh[layer] = comm.submit(std::move(op));
    };
    auto wait = [&](Comm::Handle& h) -> Status {
      const auto t0 = Clock::now();
      Status s = h.wait();
      h = Comm::Handle{};
      stall_ms += ms_since(t0);
      return s;
    };

    for (size_t j = 0; j <= static_cast<size_t>(K) && j < uses.size(); ++j) issue_gather(j);
    double loss = 0;
    for (size_t i = 0; i < uses.size(); ++i) {
      const size_t slot = i % (static_cast<size_t>(K) + 1);
      if (auto s = wait(gh[i]); !s) return fail(s);
      const Use u = uses[i];
      float* P = buf.slots[slot];
      if (!host) be.upload(P, buf.slots_host[slot], pad[u.layer]);
      switch (u.kind) {
        case UseKind::kEmbedFwd:
        case UseKind::kBlockFwd:
          forward(u, P);
          break;
        case UseKind::kHead:
          if (grad) be.zero(buf.g0, pad[0]);
          loss += be.head_forward(d, P, buf.xs[L], buf.targets, carve_head_acts(buf.head, d),
                                  grad ? buf.dx : nullptr, grad ? buf.g0 : nullptr, loss_scale);
          if (grad) fault("forward");
          break;
        case UseKind::kBlockBwd: {
          const int gi = u.layer % 2;
          // The buffer was last reduce-scattered for block layer + 2.
          if (u.layer + 2 <= L && rsh[u.layer + 2].valid())
            if (auto s = wait(rsh[u.layer + 2]); !s) return fail(s);
          be.zero(buf.gblk[gi], pad[u.layer]);
          be.block_backward(d, P, buf.gblk[gi], buf.xs[u.layer - 1],
                            carve_block_acts(buf.acts[u.layer - 1], d), buf.dx, buf.dx,
                            buf.scratch);
          issue_rs(u.layer, buf.gblk[gi], buf.g_host[1 + gi]);
          if (u.layer == L) fault("backward");
          break;
        }
        case UseKind::kEmbedBwd:
          be.embed_backward(d, buf.g0, buf.tokens, buf.dx);
          issue_rs(0, buf.g0, buf.g_host[0]);
          break;
      }
      // The slot's layer is no longer needed on the device: reuse it for the next gather.
      if (i + K + 1 < uses.size()) {
        if (!host) be.synchronize();
        issue_gather(i + K + 1);
      }
    }
    for (auto& h : rsh)
      if (h.valid())
        if (auto s = wait(h); !s) return fail(s);
    return loss;
  };

  const std::vector<Use> train_uses = step_uses(L, true), eval_uses = step_uses(L, false);
  const int64_t warmup = opts.warmup > 0 ? opts.warmup : std::max<int64_t>(1, opts.steps / 10);
  const int val_total = round_up(static_cast<size_t>(std::max(opts.val_seqs, Bg)), Bg);
  const double flops_step = m.flops_per_token(T) * Bg * T;

  auto validate_at = [&](int cur) -> Result<double> {
    double sum = 0;
    for (int c = 0; c < val_total / Bg; ++c) {
      data.val_batch(c * Bg + rank * B, B, val_total, T, tok_h.data(), tgt_h.data());
      be.upload_tokens(buf.tokens, tok_h.data(), tok_h.size());
      be.upload_tokens(buf.targets, tgt_h.data(), tgt_h.size());
      auto l = run_pass(eval_uses, cur, false);
      if (!l) return l;
      sum += *l;
    }
    if (auto s = comm.allreduce_sum(&sum, 1); !s) return fail(s);
    return sum / (static_cast<double>(val_total) * T);
  };

  // The AdamW update of `step`: reads param, m, v of buffer `cur` and the gradient, writes
  // buffer `nxt`. Calls progress.layer_done(l) as each layer's pins are released. No MPI
  // inside: safe on its own thread. Returns its duration in ms.
  auto run_optimizer = [&](int64_t step, int cur, int nxt, AdamWStep st) -> Result<double> {
    const auto t_opt = Clock::now();
    // In: param, m, v of buffer cur and the grad. Out: param, m, v of buffer nxt (the same
    // tensors when single-buffered, pinned for writing).
    using Pins = std::pair<std::vector<Pinned>, std::vector<Pinned>>;
    auto pin_layer = [&store, &opts, cur, nxt, opt_lane](int l) -> Result<Pins> {
      Pins p;
      if (opts.buffers == 2) {
        auto a = store.acquire_many(std::vector<ShardRef>{{l, ShardKind::kParam, cur},
                                                          {l, ShardKind::kM, cur},
                                                          {l, ShardKind::kV, cur},
                                                          {l, ShardKind::kGrad, 0}},
                                    Access::kRead, opt_lane);
        if (!a) return fail(a.error());
        // Buffer nxt is written whole (the update, then the padding below): its old bytes are
        // dead, so a copy spilled to NVMe is not read back for it.
        auto b = store.acquire_many(std::vector<ShardRef>{{l, ShardKind::kParam, nxt},
                                                          {l, ShardKind::kM, nxt},
                                                          {l, ShardKind::kV, nxt}},
                                    Access::kOverwrite, opt_lane);
        if (!b) return fail(b.error());
        p.first = std::move(*a);
        p.second = std::move(*b);
      } else {
        auto b = store.acquire_many(std::vector<ShardRef>{{l, ShardKind::kParam, 0},
                                                          {l, ShardKind::kM, 0},
                                                          {l, ShardKind::kV, 0}},
                                    Access::kWrite, opt_lane);
        if (!b) return fail(b.error());
        auto g = store.acquire({l, ShardKind::kGrad, 0}, Access::kRead, opt_lane);
        if (!g) return fail(g.error());
        p.second = std::move(*b);
        p.first = {p.second[0], p.second[1], p.second[2], std::move(*g)};
      }
      return p;
    };
    // The pins of layer l+1 are taken (one or two daemon round trips) while layer l updates,
    // and the inputs of layer l+2 are hinted to tierd then, so a shard spilled to NVMe is
    // fetched a whole layer's update ahead of its lease (best effort; RAM-resident: no-op).
    const int cur_in = cur;
    auto hint_layer = [&store, cur_in, NL, opt_lane](int l) {
      if (l >= NL) return;
      store.prefetch(std::vector<ShardRef>{{l, ShardKind::kParam, cur_in}, {l, ShardKind::kM, cur_in},
                                           {l, ShardKind::kV, cur_in}, {l, ShardKind::kGrad, 0}},
                     opt_lane);
    };
    hint_layer(1);
    std::future<Result<Pins>> next = std::async(std::launch::deferred, pin_layer, 0);
    for (int l = 0; l < NL; ++l) {
      auto pins = next.get();
      if (!pins) return fail(pins.error());
      if (l + 1 < NL) next = std::async(std::launch::async, pin_layer, l + 1);
      hint_layer(l + 2);
      const std::vector<Pinned>& in = pins->first;
      const std::vector<Pinned>& outp = pins->second;
      const size_t lo = static_cast<size_t>(rank) * shard[l], hi = lo + shard[l];
      for (const Range& r : decay_ranges(m, l)) {
        const size_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
        if (a >= b) continue;
        const size_t o = a - lo;
        if (opts.optimizer != nullptr) {
          if (auto s = opts.optimizer->update(in[0].data + o, in[1].data + o, in[2].data + o,
                                              in[3].data + o, outp[0].data + o, outp[1].data + o,
                                              outp[2].data + o, b - a, st, r.decay, step);
              !s)
            return fail(s);
        } else {
          adamw_update(in[0].data + o, in[1].data + o, in[2].data + o, in[3].data + o,
                       outp[0].data + o, outp[1].data + o, outp[2].data + o, b - a, st, r.decay);
        }
      }
      // The padding past the layer's last parameter (on the last ranks) is in no range: an
      // overwrite pin must still write it, so it is carried over (zeros since init).
      if (opts.buffers == 2 && std::max(lo, layer_n[l]) < hi) {
        const size_t o = std::max(lo, layer_n[l]) - lo, n = hi - lo - o;
        for (int k = 0; k < 3; ++k) std::memcpy(outp[k].data + o, in[k].data + o, n * sizeof(float));
      }
      // The gradient is dead now: the next backward overwrites it before anything reads it,
      // and a crash before this step commits redoes the backward. Spilling it would be wasted.
      // Discarded while still pinned: released first, tierd could pick it (dirty, next use an
      // overwrite) for a write-back before the discard arrives.
      store.discard(std::vector<ShardRef>{{l, ShardKind::kGrad, 0}}, opt_lane);
      std::vector<Pinned> all = std::move(pins->first);
      for (auto& q : pins->second) all.push_back(std::move(q));
      store.release_many(all, opt_lane);
      progress.layer_done(l);
      if (l == 0) fault_at("optimizer", step);
    }
    return ms_since(t_opt);
  };

  // Commit: every rank finished writing buffer step % buffers; then each daemon's marker says
  // so. The next update, which overwrites the buffer the previous commit names, starts only
  // after this: so a crash anywhere leaves a committed, intact buffer.
  // Double buffered, the buffer the step read (its `cur`) is dead once every daemon's marker
  // names the step: the next update overwrites it whole and a resume reads the other one. It
  // is discarded then, so tierd drops what of it is still in RAM instead of writing it back.
  // Only after a second barrier: a rank that discarded while another daemon's marker still named
  // the step before would leave that resume nothing to read.
  auto commit = [&](int64_t step) -> Status {
    if (auto s = comm.barrier(); !s) return s;
    fault_at("precommit", step);
    if (marker_writer) {
      CommitMarker mk{CommitMarker::kMagic, static_cast<uint64_t>(step), uint64_t(R), hash};
      if (auto s = store.write_marker(mk); !s) return s;
    }
    fault_at("postcommit", step);
    if (opts.buffers == 2) {
      if (auto s = comm.barrier(); !s) return s;
      const int read_buffer = static_cast<int>((step - 1) % 2);
      std::vector<ShardRef> dead;
      for (int l = 0; l < NL; ++l)
        for (ShardKind k : {ShardKind::kParam, ShardKind::kM, ShardKind::kV}) dead.push_back({l, k, read_buffer});
      store.discard(dead);
      fault_at("discarded", step);
    }
    return {};
  };
  // The update running on its own thread (CPU optimizer only: a GPU optimizer shares the
  // backend's device and stream with the passes, so it runs inline). Its future's destructor
  // waits for it, so no early return leaves it running.
  std::future<Result<double>> opt_job;
  int64_t opt_job_step = 0;
  // Waits for the running update and commits its step; adds its duration to `opt_ms`.
  auto finish_optimizer = [&](double& opt_ms) -> Status {
    if (!opt_job.valid()) return {};
    Result<double> r = opt_job.get();
    if (!r) return r.error();
    opt_ms += *r;
    return commit(opt_job_step);
  };

  RunSummary sum;
  sum.first_step = start;
  ShardStore::NvmeIo nvme_io_prev = rank == 0 ? store.nvme_io() : ShardStore::NvmeIo{};
  int64_t n = 0;
  for (int64_t step = start; step <= opts.steps; ++step) {
    const auto t0 = Clock::now();
    cur_step = step;
    stall_ms = 0;
    const int cur = opts.buffers == 2 ? static_cast<int>((step - 1) % 2) : 0;
    const int nxt = opts.buffers == 2 ? static_cast<int>(step % 2) : 0;
    data.train_batch(opts.seed, step, rank * B, B, T, tok_h.data(), tgt_h.data());
    be.upload_tokens(buf.tokens, tok_h.data(), tok_h.size());
    be.upload_tokens(buf.targets, tgt_h.data(), tgt_h.size());
    auto loss = run_pass(train_uses, cur, true);
    if (!loss) {
      if (opt_job.valid())  // the pass may have stopped because the update failed: say why
        if (Result<double> r = opt_job.get(); !r) return fail(r.error());
      return fail(loss.error());
    }
    // The pass waited for every layer of the previous step's update: it is done; commit it
    // before this step's update may overwrite the buffer the last commit names.
    double opt_ms = 0;
    if (auto s = finish_optimizer(opt_ms); !s) return fail(s);

    if (!opts.dump_dir.empty() && step - start < opts.dump_steps) {
      const std::string dir = opts.dump_dir + "/";
      if (auto s = dump_layers(comm, store, ShardKind::kParam, cur, shard, layer_n,
                               fmt::format("{}params.{}.bin", dir, step)); !s)
        return fail(s);
      if (auto s = dump_layers(comm, store, ShardKind::kGrad, 0, shard, layer_n,
                               fmt::format("{}grads.{}.bin", dir, step)); !s)
        return fail(s);
    }

    // Global gradient norm and loss in one all-reduce.
    double red[2] = {0, *loss};
    for (int l = 0; l < NL; ++l) red[0] += grad_sumsq[l];
    if (auto s = comm.allreduce_sum(red, 2); !s) return fail(s);
    const double norm = std::sqrt(red[0]);
    const float clip = opts.grad_clip > 0 && norm > opts.grad_clip
                           ? static_cast<float>(opts.grad_clip / norm) : 1.0f;
    const float lr = lr_at(opts.adamw.lr, step, warmup, opts.steps);
    const AdamWStep st = make_step(opts.adamw, lr, step, clip);
    if (overlap_optimizer) {
      progress.start();
      opt_job_step = step;
      opt_job = std::async(std::launch::async, [&, step, cur, nxt, st] {
        Result<double> r = run_optimizer(step, cur, nxt, st);
        progress.finish(r.has_value());
        return r;
      });
    } else {
      auto r = run_optimizer(step, cur, nxt, st);
      if (!r) return fail(r.error());
      opt_ms += *r;
      if (auto s = commit(step); !s) return fail(s);
    }
    // The last step and validation steps wait for their own update (validation reads it).
    const bool last = step == opts.steps;
    const bool validate = opts.val_every >= 0 && (last || (opts.val_every > 0 && step % opts.val_every == 0));
    if (last || validate)
      if (auto s = finish_optimizer(opt_ms); !s) return fail(s);

    StepStats ss;
    ss.step = step;
    ss.loss = red[1] / (static_cast<double>(Bg) * T);
    ss.grad_norm = norm;
    ss.ms = ms_since(t0);
    ss.stall_ms = stall_ms;
    ss.opt_ms = opt_ms;
    ss.tokens_per_s = static_cast<double>(Bg) * T / (ss.ms / 1000.0);
    ss.tflops = flops_step / R / (ss.ms / 1000.0) / 1e12;
    // NVMe traffic of this node since the last step (tierd's node-wide counters; one status
    // round trip on rank 0, after the step's time was taken). 0 for resident state.
    double nvme_gbps = 0, nvme_read_mib = 0, nvme_written_mib = 0;
    if (rank == 0) {
      const ShardStore::NvmeIo io = store.nvme_io();
      if (io.read >= 0 && nvme_io_prev.read >= 0) {
        nvme_read_mib = static_cast<double>(io.read - nvme_io_prev.read) / (1 << 20);
        nvme_written_mib = static_cast<double>(io.written - nvme_io_prev.written) / (1 << 20);
        nvme_gbps = (nvme_read_mib + nvme_written_mib) * (1 << 20) / (ss.ms / 1e3) / 1e9;
      }
      nvme_io_prev = io;
    }
    if (validate) {
      auto v = validate_at(nxt);
      if (!v) return fail(v.error());
      ss.val_loss = *v;
      sum.last_val_loss = *v;
    }
    if (rank == 0 && out != nullptr) {
      std::string line = fmt::format(
          "{{\"step\":{},\"loss\":{:.9g},\"ms\":{:.3f},\"tokens_per_s\":{:.1f},\"tflops\":{:.6f},"
          "\"stall_ms\":{:.3f},\"h2d_gbps\":0,\"nvme_gbps\":{:.3f},\"nvme_read_mib\":{:.1f},"
          "\"nvme_written_mib\":{:.1f},\"opt_ms\":{:.3f},\"grad_norm\":{:.9g}",
          ss.step, ss.loss, ss.ms, ss.tokens_per_s, ss.tflops, ss.stall_ms, nvme_gbps, nvme_read_mib,
          nvme_written_mib, ss.opt_ms, ss.grad_norm);
      if (ss.val_loss >= 0) line += fmt::format(",\"val_loss\":{:.9g}", ss.val_loss);
      line += "}\n";
      std::fputs(line.c_str(), out);
      std::fflush(out);
    }
    if (n == 0) sum.first_loss = ss.loss;
    sum.last_loss = ss.loss;
    sum.last_step = step;
    sum.mean_ms += ss.ms;
    sum.mean_tokens_per_s += ss.tokens_per_s;
    sum.mean_tflops += ss.tflops;
    sum.mean_stall_ms += ss.stall_ms;
    sum.mean_opt_ms += ss.opt_ms;
    ++n;
  }
  if (n > 0) {
    sum.mean_ms /= n;
    sum.mean_tokens_per_s /= n;
    sum.mean_tflops /= n;
    sum.mean_stall_ms /= n;
    sum.mean_opt_ms /= n;
  }
  return sum;
}

}  // namespace tier::train
