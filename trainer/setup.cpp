// The training run's setup: geometry, the sharded state (initialized or resumed), the device
// buffers and the step's plan for tierd (see step.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "trainer/bf16.hpp"
#include "trainer/step.hpp"
#include "wire/errors.hpp"

namespace tier::train::detail {

ActivationCounts activation_counts(const Dims& d, int L, bool checkpoint, bool offload) {
  const size_t BTC = static_cast<size_t>(d.B) * d.T * d.C;
  return {checkpoint && offload ? 2 : L + 1, checkpoint ? 1 : L, std::max(block_scratch_floats(d), BTC)};
}

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

Buffers::~Buffers() {
  for (float* p : owned) be->free(p);
  if (tokens) be->free_tokens(tokens);
  if (targets) be->free_tokens(targets);
  for (HostBuf& h : host_owned) {
    if (h.pinned) be->unpin_host(h.p);
    std::free(h.p);
  }
}

float* Buffers::dev(size_t n) {
  float* p = be->alloc(std::max<size_t>(n, 1));
  if (p) owned.push_back(p);
  return p;
}

float* Buffers::host(size_t n) {
  const size_t bytes = round_up(std::max<size_t>(n, 1) * sizeof(float), 4096);
  auto* p = static_cast<float*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) return nullptr;
  std::memset(p, 0, bytes);
  host_owned.push_back({p, be->pin_host(p, bytes)});
  return p;
}

uint64_t domain_hash(const ShardStore& store) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : store.marker_domain()) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

Result<bool> is_marker_writer(Comm& comm, const ShardStore& store) {
  const uint64_t h = domain_hash(store);
  auto all = comm.allgather(h);
  if (!all) return fail(all.error());
  return std::find(all->begin(), all->begin() + comm.rank(), h) == all->begin() + comm.rank();
}

// The options were checked by train(): T <= model seq, batch a multiple of the rank count.
Trainer::Trainer(const TrainOptions& o, const Dataset& data_, Comm& comm_, Backend& be_, ShardStore& store_,
                 std::FILE* out_)
    : opts(o),
      m(o.model),
      data(data_),
      comm(comm_),
      be(be_),
      store(store_),
      out(out_),
      R(comm_.size()),
      rank(comm_.rank()),
      T(o.seq > 0 ? o.seq : o.model.seq),
      Bg(o.batch),
      B(o.batch / comm_.size()),
      L(o.model.layers),
      NL(o.model.num_layers()),
      K(std::max(0, o.prefetch)),
      d(o.model.dims(B, T, o.attention)),
      BTC(static_cast<size_t>(B) * T * o.model.dim),
      hash(run_config_hash(o, comm_.size())),
      host(be_.host_accessible()),
      ckpt(o.checkpoint_activations),
      offload_ckpt(o.checkpoint_activations && o.offload_checkpoints),
      bf16(o.precision == Precision::kBf16),
      overlap_optimizer(o.overlap_optimizer && o.optimizer == nullptr),
      opt_lane(overlap_optimizer ? Lane::kOptimizer : Lane::kPass),
      loss_scale(1.0f / (static_cast<float>(Bg) * static_cast<float>(T))),
      train_uses(step_uses(L, true)),
      eval_uses(step_uses(L, false)),
      warmup(o.warmup > 0 ? o.warmup : default_warmup(o.steps)),
      val_total(static_cast<int>(round_up(static_cast<size_t>(std::max(o.val_seqs, Bg)), Bg))),
      flops_step(o.model.flops_per_token(T) * Bg * T),
      tok_h(static_cast<size_t>(B) * T),
      tgt_h(static_cast<size_t>(B) * T),
      gather_pins(static_cast<size_t>(K) + 1),
      rs_pins(NL),
      grad_sumsq(NL, 0.0) {
  // Shard geometry: padded so every shard is a whole number of 64-byte lines (the memory
  // model's, so --plan sizes the same shards).
  const ShardGeometry g = shard_geometry(m, R);
  layer_n = g.layer_floats;
  pad = g.pad;
  shard = g.shard;
  max_pad = g.max_pad;
  buf.be = &be;
}

Status Trainer::open_state() {
  StoreLayout layout;
  layout.rank = rank;
  layout.ranks = R;
  layout.local_rank = comm.local_rank();
  layout.gpu_pci = opts.gpu_pci;
  layout.buffers = opts.buffers;
  layout.shard_floats = shard;
  layout.ckpt_floats = offload_ckpt ? BTC : 0;
  layout.precision = opts.precision;
  if (opts.resume && opts.reshard) return reshard_state(layout);

  // One marker per daemon the job uses, whatever the host layout (two daemons on one host, or
  // one per node): its writer is the lowest rank whose state that daemon holds.
  auto writer = is_marker_writer(comm, store);
  if (!writer) return writer.error();
  marker_writer = *writer;
  if (opts.resume) {
    if (auto s = roll_back_if_recovered(); !s) return s;
    // Every rank reads its own daemon's marker; the job then agrees on one verdict, so a
    // rank whose daemon has none fails the job instead of leaving the others in a collective.
    // Read before open(): opening replaces shards of another size (another rank count's),
    // which a refused resume must leave as they are.
    auto mk = store.read_marker();
    const bool ok =
        mk && mk->magic == CommitMarker::kMagic && mk->config_hash == hash && mk->ranks == uint64_t(R);
    const double step = ok ? static_cast<double>(mk->step) : 0.0;
    double v[3] = {ok ? 0.0 : 1.0, step, -step};  // any marker bad, newest, -oldest
    if (auto st = comm.allreduce_max(v, 3); !st) return st;
    if (!mk) return mk.error();
    if (v[0] != 0.0)
      return Status(Code::kInvalidArgument,
                    "--resume: the job's state was not written by this model, rank count, batch and "
                    "seed (or no step was ever committed) in every daemon it uses");
    // A marker says step s only after every rank finished s; daemons whose marker writer died
    // between the barrier and its write say s - 1. Both buffers are intact then (see commit).
    // Markers further apart were not written by one run of this job (a daemon's pool rolled
    // back or replaced): no buffer holds one step for every rank.
    const auto newest = static_cast<int64_t>(v[1]), oldest = static_cast<int64_t>(-v[2]);
    if (newest - oldest > 1)
      return Status(Code::kInvalidArgument,
                    fmt::format("--resume: the daemons' commit markers say steps {} to {}; one run "
                                "leaves them at most one step apart, so no step is held by all",
                                oldest, newest));
    start = newest + 1;
    return store.open(layout);
  }
  if (auto s = store.open(layout); !s) return s;
  // Invalidate the marker before overwriting the state, then initialize buffer 0.
  if (marker_writer)
    if (auto s = store.write_marker(CommitMarker{}); !s) return s;
  if (auto s = comm.barrier(); !s) return s;
  std::vector<float> full;  // [pad[l]]
  for (int l = 0; l < NL; ++l) {
    full.assign(pad[l], 0.0f);
    init_layer(m, l, opts.seed, std::span<float>(full.data(), layer_n[l]));
    const float* mine = full.data() + rank * shard[l];  // [shard[l]]
    for (int b = 0; b < opts.buffers; ++b) {
      std::vector<ShardRef> refs{{l, ShardKind::kParam, b}, {l, ShardKind::kM, b}, {l, ShardKind::kV, b}};
      if (bf16) refs.push_back({l, ShardKind::kMaster, b});
      auto pv = store.acquire_many(refs, Access::kOverwrite);
      if (!pv) return pv.error();
      // bf16: the fp32 master and its rounded working copy, as the optimizer writes them.
      if (bf16) f32_to_bf16(mine, (*pv)[0].bf16(), shard[l]);
      else std::memcpy((*pv)[0].data, mine, shard[l] * sizeof(float));
      std::memset((*pv)[1].data, 0, shard[l] * sizeof(float));
      std::memset((*pv)[2].data, 0, shard[l] * sizeof(float));
      if (bf16) std::memcpy((*pv)[3].data, mine, shard[l] * sizeof(float));
    }
    auto g = store.acquire({l, ShardKind::kGrad, 0}, Access::kOverwrite);
    if (!g) return g.error();
    std::memset(g->data, 0, shard[l] * shard_elem_bytes(ShardKind::kGrad, opts.precision));
  }
  if (auto s = comm.barrier(); !s) return s;
  if (marker_writer) {
    CommitMarker mk{CommitMarker::kMagic, 0, uint64_t(R), hash};
    if (auto s = store.write_marker(mk); !s) return s;
  }
  return comm.barrier();
}

Status Trainer::alloc_buffers() {
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
    if (bf16) {
      for (int i = 0; i <= K; ++i) buf.slots_bf16.push_back(buf.host_bf16(max_pad));
      for (size_t n : {pad[0], pad_blk, pad_blk}) {
        buf.g_bf16.push_back(buf.host_bf16(n));
        buf.g_chunks.push_back(buf.host_bf16(n));
      }
    }
  } else if (auto s = opts.stream->open(store, shard, K + 1, opts.precision); !s) {
    return s;
  }
  // Activations: activation_floats() of them, counted as allocated (the run reports it).
  const ActivationCounts n = activation_counts(d, L, ckpt, offload_ckpt);
  auto act = [this](size_t floats) {
    buf.act_floats += floats;
    return buf.dev(floats);
  };
  for (int i = 0; i < n.xs; ++i) buf.xs.push_back(act(BTC));
  for (int i = 0; i < n.acts; ++i) buf.acts.push_back(act(block_acts_floats(d)));
  buf.head = act(head_acts_floats(d));
  buf.scratch = act(n.scratch);
  buf.dx = act(BTC);
  buf.tokens = be.alloc_tokens(static_cast<size_t>(B) * T);
  buf.targets = be.alloc_tokens(static_cast<size_t>(B) * T);
  for (float* p : buf.owned)
    if (p == nullptr) return Status(Code::kResourceExhausted, "backend allocation failed");
  for (float* p : buf.slots_host)
    if (p == nullptr) return Status(Code::kResourceExhausted, "host staging allocation failed");
  for (float* p : buf.g_host)
    if (p == nullptr) return Status(Code::kResourceExhausted, "host staging allocation failed");
  for (const auto* v : {&buf.slots_bf16, &buf.g_bf16, &buf.g_chunks})
    for (uint16_t* p : *v)
      if (p == nullptr) return Status(Code::kResourceExhausted, "host staging allocation failed");
  if (!buf.tokens || !buf.targets) return Status(Code::kResourceExhausted, "backend allocation failed");
  return {};
}

// The step's plan for tierd: param shards in gather order (and offloaded checkpoints where
// the blocks use them), grads in backward order (written whole by the reduce-scatter:
// overwrites), then per layer the optimizer's inputs and, double buffered, the other buffer
// it writes whole (overwrites). Registered for both buffers' parity (it repeats every two
// steps). With --overlap-optimizer the update runs on its own thread and lane (its own tierd
// client): the passes and the update are then two plans.
void Trainer::set_plan() {
  std::vector<ShardUse> plan, opt_plan;
  std::vector<ShardUse>& opt_uses = overlap_optimizer ? opt_plan : plan;
  const bool two = opts.buffers == 2;
  for (int b = 0; b < opts.buffers; ++b) {
    for (const Use& u : train_uses) {
      plan.push_back({{u.layer, ShardKind::kParam, b}, false});
      // Offloaded checkpoints: block l's input written whole in forward, read in backward.
      if (offload_ckpt && (u.kind == UseKind::kBlockFwd || u.kind == UseKind::kBlockBwd))
        plan.push_back({{u.layer, ShardKind::kCkpt, 0}, u.kind == UseKind::kBlockFwd});
      if (u.kind == UseKind::kBlockBwd || u.kind == UseKind::kEmbedBwd)
        plan.push_back({{u.layer, ShardKind::kGrad, 0}, true});
    }
    for (int l = 0; l < NL; ++l) {
      for (ShardKind k : opt_in_kinds()) opt_uses.push_back({{l, k, b}, false});
      opt_uses.push_back({{l, ShardKind::kGrad, 0}, false});
      if (two)
        for (ShardKind k : opt_out_kinds()) opt_uses.push_back({{l, k, 1 - b}, true});
      else if (bf16)
        opt_uses.push_back({{l, ShardKind::kParam, 0}, false});  // the working copy, updated in place
    }
  }
  store.set_plan(plan, Lane::kPass);
  if (overlap_optimizer) store.set_plan(opt_plan, Lane::kOptimizer);
}

}  // namespace tier::train::detail

namespace tier::train {

size_t activation_floats(const Dims& d, int layers, bool checkpoint, bool offload) {
  const detail::ActivationCounts n = detail::activation_counts(d, layers, checkpoint, offload);
  const size_t BTC = static_cast<size_t>(d.B) * d.T * d.C;
  return static_cast<size_t>(n.xs + 1) * BTC  // the residual stream and its gradient dx
         + static_cast<size_t>(n.acts) * block_acts_floats(d) + head_acts_floats(d) + n.scratch;
}

}  // namespace tier::train
