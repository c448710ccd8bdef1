// One pass over the layer uses (step.hpp): the compute of each use, written once in
// Trainer::forward/backward, and the two ways its layers move: HostPass (MPI collectives on
// the comm thread, Backend::upload/download when the device is not host memory) and
// StreamPass (opts.stream, --collectives nccl: copies, gathers and reduce-scatters on the
// device). Both pin a shard only after the overlapped update of its layer is done.
// With --precision bf16 HostPass gathers bf16 shards into bf16 staging and widens them into
// the slot (exact; on the device when the backend can: Backend::upload_bf16), and rounds each
// fp32 layer gradient to bf16 (likewise: download_bf16) before its bf16 reduce-scatter (an
// all-to-all, then the fp32 sum in rank order: trainer/comm.hpp). StreamPass hands the bf16
// shards to the LayerStream, which moves and reduces them as bf16.

#include "trainer/bf16.hpp"
#include "trainer/step.hpp"
#include "wire/errors.hpp"

namespace tier::train::detail {

namespace {

Status opt_failed() {
  return Status(Code::kInternal, "the previous step's optimizer failed (its error follows)");
}

// Pins layer's grad shard into t.rs_pins[layer] for a reduce-scatter to write, once the
// overlapped update no longer reads the old gradient. An overwrite pin: the reduce-scatter
// writes every element of the shard, so nothing is read back. Runs on the comm thread.
Status pin_grad_shard(Trainer& t, int layer) {
  if (!t.progress.wait_layer(layer)) return opt_failed();
  auto p = t.store.acquire({layer, ShardKind::kGrad, 0}, Access::kOverwrite);
  if (!p) return p.error();
  t.rs_pins[layer] = std::move(*p);
  return {};
}

// Layer params gathered into K+1 slots by the comm thread; a block's gradient goes to one of
// two buffers, alternating, so block l's backward overlaps block l+1's reduce-scatter.
class HostPass final : public Pass {
 public:
  HostPass(Trainer& t, const std::vector<Use>& uses, int cur, bool grad)
      : Pass(t, uses, cur, grad), gh_(uses.size()), rsh_(t.NL) {}

  Status begin() override {
    for (size_t j = 0; j <= static_cast<size_t>(t_.K) && j < uses_.size(); ++j) issue_gather(j);
    return {};
  }
  Result<LayerParams> params(size_t i) override {
    const size_t slot = i % (static_cast<size_t>(t_.K) + 1);
    if (auto s = wait(gh_[i]); !s) return fail(s);
    float* P = t_.buf.slots[slot];
    const size_t n = t_.pad[uses_[i].layer];
    // bf16 on a device backend: half the bytes cross the bus, widened there.
    if (t_.bf16 && !t_.host && t_.be.upload_bf16(P, t_.buf.slots_bf16[slot], n)) return P;
    if (t_.bf16) bf16_to_f32(t_.buf.slots_bf16[slot], t_.buf.slots_host[slot], n);
    if (!t_.host) t_.be.upload(P, t_.buf.slots_host[slot], n);
    return P;
  }
  Result<float*> grad_buffer(int layer) override {
    if (layer == 0) {
      t_.be.zero(t_.buf.g0, t_.pad[0]);
      return t_.buf.g0;
    }
    // The buffer was last reduce-scattered for block layer + 2.
    if (layer + 2 <= t_.L && rsh_[layer + 2].valid())
      if (auto s = wait(rsh_[layer + 2]); !s) return fail(s);
    float* g = t_.buf.gblk[layer % 2];
    t_.be.zero(g, t_.pad[layer]);
    return g;
  }
  Status push_grad(int layer, float* g) override {
    const int gi = layer == 0 ? 0 : 1 + layer % 2;
    float* g_host = t_.buf.g_host[gi];
    if (t_.bf16) {
      // Rounded on the device when the backend can (the same bits), else here.
      if (t_.host || !t_.be.download_bf16(t_.buf.g_bf16[gi], g, t_.pad[layer])) {
        if (!t_.host) t_.be.download(g_host, g, t_.pad[layer]);
        f32_to_bf16(g_host, t_.buf.g_bf16[gi], t_.pad[layer]);
      }
      return push_grad_bf16(layer, gi);
    }
    if (!t_.host) t_.be.download(g_host, g, t_.pad[layer]);
    Trainer& t = t_;
    Comm::Op op;
    op.start = [&t, layer, g_host](Comm::Request& req) -> Status {
      if (Status s = pin_grad_shard(t, layer); !s) return s;
      return t.comm.start_reduce_scatter(g_host, t.rs_pins[layer].data, t.shard[layer], req);
    };
    // The shard's squared norm is taken here, while the shard is still pinned, so the
    // optimizer's global-norm pass needs no second pin.
    op.finish = [&t, layer] {
      if (t.rs_pins[layer].data != nullptr)
        t.grad_sumsq[layer] = sum_squares(t.rs_pins[layer].data, t.shard[layer]);
      t.rs_pins[layer].release();
    };
    rsh_[layer] = t_.comm.submit(std::move(op));
    return {};
  }
  // The bf16 gradient [pad[layer]] (in g_bf16[gi]) all-to-all'ed into g_chunks[gi],
  // summed in fp32 into the rank's bf16 grad shard. The staging buffers are those of g_host[gi]:
  // free again once grad_buffer() waited for this reduce-scatter.
  Status push_grad_bf16(int layer, int gi) {
    Trainer& t = t_;
    Comm::Op op;
    op.start = [&t, layer, gi](Comm::Request& req) -> Status {
      if (Status s = pin_grad_shard(t, layer); !s) return s;
      return t.comm.start_alltoall_bf16(t.buf.g_bf16[gi], t.buf.g_chunks[gi], t.shard[layer], req);
    };
    op.finish = [&t, layer, gi] {
      if (t.rs_pins[layer].data != nullptr) {
        sum_chunks_bf16(t.buf.g_chunks[gi], t.R, t.shard[layer], t.rs_pins[layer].bf16());
        t.grad_sumsq[layer] = sum_squares_bf16(t.rs_pins[layer].bf16(), t.shard[layer]);
      }
      t.rs_pins[layer].release();
    };
    rsh_[layer] = t_.comm.submit(std::move(op));
    return {};
  }
  // The slot's layer is no longer needed on the device: reuse it for the next gather.
  Status done(size_t i) override {
    if (i + t_.K + 1 < uses_.size()) {
      if (!t_.host) t_.be.synchronize();
      issue_gather(i + t_.K + 1);
    }
    return {};
  }
  Status end(Status s) override {
    if (!s) return s;
    for (auto& h : rsh_)
      if (h.valid())
        if (auto st = wait(h); !st) return st;
    return {};
  }

 private:
  void issue_gather(size_t j) {
    const size_t slot = j % (static_cast<size_t>(t_.K) + 1);
    const int layer = uses_[j].layer;
    const ShardRef ref{layer, ShardKind::kParam, cur_};
    std::vector<ShardRef> hint;
    if (t_.K > 0 && j + t_.K < uses_.size()) hint.push_back({uses_[j + t_.K].layer, ShardKind::kParam, cur_});
    Trainer& t = t_;
    Comm::Op op;
    op.start = [&t, ref, slot, layer, hint](Comm::Request& req) -> Status {
      if (!t.progress.wait_layer(layer)) return opt_failed();
      if (!hint.empty()) t.store.prefetch(hint);
      auto p = t.store.acquire(ref, Access::kRead);
      if (!p) return p.error();
      t.gather_pins[slot] = std::move(*p);
      if (t.bf16)
        return t.comm.start_allgather_bf16(t.gather_pins[slot].bf16(), t.buf.slots_bf16[slot], t.shard[layer],
                                           req);
      return t.comm.start_allgather(t.gather_pins[slot].data, t.buf.slots_host[slot], t.shard[layer], req);
    };
    op.finish = [&t, slot] { t.gather_pins[slot].release(); };
    gh_[j] = t_.comm.submit(std::move(op));
  }
  Status wait(Comm::Handle& h) {
    const auto t0 = Clock::now();
    Status s = h.wait();
    h = Comm::Handle{};
    t_.stall_ms += ms_since(t0);
    return s;
  }

  std::vector<Comm::Handle> gh_;   // per use: its gather
  std::vector<Comm::Handle> rsh_;  // per layer: its reduce-scatter
};

// The pass through opts.stream: this thread pins the shards (waiting first, as the host
// path's comm thread does, for the overlapped update of the layer) and hands the pins over.
// Time spent pinning and in finish() counts as stall.
class StreamPass final : public Pass {
 public:
  StreamPass(Trainer& t, const std::vector<Use>& uses, int cur, bool grad)
      : Pass(t, uses, cur, grad), ls_(*t.opts.stream), fetched_(uses.size()) {}

  Status begin() override {
    for (size_t j = 0; j <= static_cast<size_t>(t_.K) && j < uses_.size(); ++j)
      if (auto s = fetch(j); !s) return s;
    return {};
  }
  Result<LayerParams> params(size_t i) override { return fetched_[i]; }
  Result<float*> grad_buffer(int layer) override { return ls_.grad_buffer(layer); }
  // The reduce-scatter writes every float of the shard: nothing to read back.
  Status push_grad(int layer, float*) override {
    auto p = pin({layer, ShardKind::kGrad, 0}, Access::kOverwrite);
    if (!p) return p.error();
    return ls_.push_grad(layer, std::move(*p), &t_.grad_sumsq[layer]);
  }
  Status done(size_t i) override {
    if (auto s = ls_.done_with_oldest(); !s) return s;
    if (i + t_.K + 1 < uses_.size())
      if (auto s = fetch(i + t_.K + 1); !s) return s;
    return {};
  }
  Status end(Status s) override {
    const auto t0 = Clock::now();
    Status f = ls_.finish();  // also after a failure: drops the pins
    t_.stall_ms += ms_since(t0);
    if (!s) return s;
    return f;
  }

 private:
  Result<Pinned> pin(const ShardRef& ref, Access access) {
    const auto t0 = Clock::now();
    if (!t_.progress.wait_layer(ref.layer)) return fail(opt_failed());
    auto p = t_.store.acquire(ref, access);
    t_.stall_ms += ms_since(t0);
    return p;
  }
  Status fetch(size_t j) {
    if (t_.K > 0 && j + t_.K < uses_.size())
      t_.store.prefetch(std::vector<ShardRef>{{uses_[j + t_.K].layer, ShardKind::kParam, cur_}});
    auto p = pin({uses_[j].layer, ShardKind::kParam, cur_}, Access::kRead);
    if (!p) return p.error();
    auto dev = ls_.fetch(uses_[j].layer, std::move(*p));
    if (!dev) return dev.error();
    fetched_[j] = *dev;
    return {};
  }

  LayerStream& ls_;
  std::vector<LayerParams> fetched_;  // per use: its params on the device [pad[layer]]
};

}  // namespace

std::unique_ptr<Pass> Trainer::open_pass(const std::vector<Use>& uses, int cur, bool grad) {
  if (opts.stream != nullptr) return std::make_unique<StreamPass>(*this, uses, cur, grad);
  return std::make_unique<HostPass>(*this, uses, cur, grad);
}

// Loads this rank's B sequences of step `step` into tokens, targets [B,T].
void Trainer::load_batch(int64_t step) {
  data.train_batch(opts.seed, step, rank * B, B, T, tok_h.data(), tgt_h.data());
  be.upload_tokens(buf.tokens, tok_h.data(), tok_h.size());
  be.upload_tokens(buf.targets, tgt_h.data(), tgt_h.size());
}

// Uses 0..L+1: x_0 = embed(tokens) [B,T,C]; x_l = block_l(x_{l-1}) [B,T,C]; the head's loss
// (summed over the rank's tokens, times loss_scale in its gradient). With grad, the head also
// runs its backward: dx = dloss/dx_L [B,T,C] and layer 0's gradient g0 [pad0] (the tied wte,
// lnf), and with --offload-checkpoints each block's input goes to the tier before it runs.
Status Trainer::forward(Pass& p, double& loss) {
  for (size_t i = 0; i <= static_cast<size_t>(L) + 1; ++i) {
    const Use u = p.uses()[i];
    auto P = p.params(i);  // the layer's params [pad[layer]]
    if (!P) return P.error();
    switch (u.kind) {
      case UseKind::kEmbedFwd: be.embed_forward(d, *P, buf.tokens, x_at(0)); break;
      case UseKind::kBlockFwd:
        if (offload_ckpt && p.grad())
          if (auto s = save_block_input(u.layer); !s) return s;
        be.block_forward(d, *P, x_at(u.layer - 1), acts_of(u.layer), x_at(u.layer));
        break;
      case UseKind::kHead:
        if (p.grad()) {
          auto g = p.grad_buffer(0);
          if (!g) return g.error();
          p.g0 = *g;
        }
        loss += be.head_forward(d, *P, x_at(L), buf.targets, carve_head_acts(buf.head, d),
                                p.grad() ? buf.dx : nullptr, p.g0, loss_scale);
        if (p.grad()) fault("forward");
        break;
      default: return Status(Code::kInternal, "forward: a backward use");
    }
    if (auto s = p.done(i); !s) return s;
  }
  return {};
}

// Uses L+2..2L+2: block l's backward (checkpointed: after recomputing the block's forward)
// takes dx [B,T,C] to the gradient of x_{l-1} (in place),
// writes its gradient [pad[l]], reduce-scattered into the rank's shard; then the embedding's
// backward adds to g0 [pad0] (wte rows of the batch's tokens, wpe) and reduce-scatters it.
Status Trainer::backward(Pass& p) {
  for (size_t i = static_cast<size_t>(L) + 2; i < p.uses().size(); ++i) {
    const Use u = p.uses()[i];
    auto P = p.params(i);
    if (!P) return P.error();
    if (u.kind == UseKind::kBlockBwd) {
      auto g = p.grad_buffer(u.layer);
      if (!g) return g.error();
      // x_{l-1} [B,T,C] and the block's activations: as the forward left them, or recomputed.
      const float* x = x_at(u.layer - 1);
      if (ckpt) {
        auto xr = recompute_block(u.layer, *P);
        if (!xr) return xr.error();
        x = *xr;
      }
      be.block_backward(d, *P, *g, x, acts_of(u.layer), buf.dx, buf.dx, buf.scratch);
      if (auto s = p.push_grad(u.layer, *g); !s) return s;
      if (u.layer == L) fault("backward");
    } else {
      be.embed_backward(d, p.g0, buf.tokens, buf.dx);
      if (auto s = p.push_grad(0, p.g0); !s) return s;
    }
    if (auto s = p.done(i); !s) return s;
  }
  return {};
}

float* Trainer::x_at(int l) const { return buf.xs[static_cast<size_t>(offload_ckpt ? l % 2 : l)]; }

BlockActs Trainer::acts_of(int l) const {
  return carve_block_acts(buf.acts[static_cast<size_t>(ckpt ? 0 : l - 1)], d);
}

Status Trainer::save_block_input(int l) {
  const auto t0 = Clock::now();
  // Every float is written: an overwrite lease (a copy spilled to NVMe is not read back).
  auto c = store.acquire({l, ShardKind::kCkpt, 0}, Access::kOverwrite);
  stall_ms += ms_since(t0);
  if (!c) return c.error();
  be.download(c->data, x_at(l - 1), BTC);  // synchronizes: x_{l-1} is computed
  c->release();
  return {};
}

// The params are those gathered for block l's backward: the same bits its forward used (the
// update runs after the pass), so the recomputed activations are the forward's bit for bit.
// Offloaded, x_{l-1} comes back into xs[0] (free once the head has read x_L). The block's
// output is not needed: it goes to the scratch, which the backward overwrites next.
Result<const float*> Trainer::recompute_block(int l, LayerParams params) {
  float* x = x_at(l - 1);
  if (offload_ckpt) {
    x = buf.xs[0];
    const auto t0 = Clock::now();
    if (l > 1) store.prefetch(std::vector<ShardRef>{{l - 1, ShardKind::kCkpt, 0}});
    auto c = store.acquire({l, ShardKind::kCkpt, 0}, Access::kRead);
    stall_ms += ms_since(t0);
    if (!c) return fail(c.error());
    be.upload(x, c->data, BTC);  // returns once the lease's bytes are read
    c->release();
    // Dead until the next forward overwrites it: tierd need not write it back to NVMe.
    store.discard(std::vector<ShardRef>{{l, ShardKind::kCkpt, 0}});
  }
  be.block_forward(d, params, x, acts_of(l), buf.scratch);
  return x;
}

// The mean loss per token over val_total validation sequences, params from buffer `cur`.
Result<double> Trainer::validate_at(int cur) {
  double sum = 0;
  for (int c = 0; c < val_total / Bg; ++c) {
    data.val_batch(c * Bg + rank * B, B, val_total, T, tok_h.data(), tgt_h.data());
    be.upload_tokens(buf.tokens, tok_h.data(), tok_h.size());
    be.upload_tokens(buf.targets, tgt_h.data(), tgt_h.size());
    auto p = open_pass(eval_uses, cur, false);
    double loss = 0;
    Status s = p->begin();
    if (s) s = forward(*p, loss);
    if (s = p->end(std::move(s)); !s) return fail(s);
    sum += loss;
  }
  if (auto s = comm.allreduce_sum(&sum, 1); !s) return fail(s);
  return sum / (static_cast<double>(val_total) * T);
}

}  // namespace tier::train::detail
