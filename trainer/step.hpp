// The pieces of tier-train's training step (trainer.hpp's train() is the loop over them).
// Internal to trainer/: trainer.cpp (the loop and a step), setup.cpp (state, buffers, plan),
// pass.cpp (forward, backward and the two ways to move a layer: host or layer stream),
// update.cpp (the AdamW update, inline or overlapped, and the commit).
//
// Shapes: B sequences of this rank, T tokens, C = dim, V = vocab, L blocks, NL = L + 1 layers
// (layer 0: wte, wpe, lnf; layers 1..L: blocks). pad[l]: layer l's floats padded to a multiple
// of 16 * R; shard[l] = pad[l] / R is the part rank r owns of its params, grad, m and v.
#pragma once

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "trainer/memory_model.hpp"
#include "trainer/trainer.hpp"

namespace tier::train::detail {

inline size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

enum class UseKind { kEmbedFwd, kBlockFwd, kHead, kBlockBwd, kEmbedBwd };
struct Use {
  UseKind kind;
  int layer;
};

// How many [B,T,C] residual-stream buffers and BlockActs buffers a rank holds, and the
// scratch's floats (it also takes a recompute's output): activation_floats() sums them.
struct ActivationCounts {
  int xs = 0, acts = 0;
  size_t scratch = 0;
};
ActivationCounts activation_counts(const Dims& d, int L, bool checkpoint, bool offload);

// The layer uses of one training step (grad) or one forward pass (eval):
//   embed(0) fwd, block 1..L fwd, head(0) fwd (+bwd), [block L..1 bwd, embed(0) bwd]
std::vector<Use> step_uses(int L, bool grad);

// Device buffers of one rank, sized for B sequences of T tokens. Owns what it allocates.
struct Buffers {
  Backend* be = nullptr;
  std::vector<float*> owned;
  std::vector<float*> slots;            // K+1 gathered layers [max_pad]
  std::vector<float*> slots_host;       // host staging when the backend is not host-accessible
  float* g0 = nullptr;                  // layer 0 gradient [pad0]
  float* gblk[2] = {nullptr, nullptr};  // block gradients [pad1], alternating
  std::vector<float*> g_host;           // staging for g0, gblk[0], gblk[1]
  // --precision bf16, host staging of the bf16 collectives (bf16 bits):
  std::vector<uint16_t*> slots_bf16;  // per slot: the gathered bf16 layer [max_pad]
  std::vector<uint16_t*> g_bf16;      // per g_host buffer: its gradient rounded to bf16 [pad]
  std::vector<uint16_t*> g_chunks;    // per g_host buffer: the all-to-all's chunks [R * shard = pad]
  std::vector<float*> xs;             // residual stream x_0..x_L [B,T,C] (*)
  std::vector<float*> acts;           // per block [block_acts_floats] (*)
  float* head = nullptr;              // [head_acts_floats]
  float* scratch = nullptr;           // [max(block_scratch_floats, BTC)] (*)
  float* dx = nullptr;                // gradient of the residual stream [B,T,C]
  size_t act_floats = 0;              // of xs, acts, head, scratch, dx: activation_floats()
  int32_t* tokens = nullptr;          // [B,T]
  int32_t* targets = nullptr;         // [B,T]
  // (*) --checkpoint-activations: one acts, shared by every block (it holds the block computed
  // last: the forward's, or the backward's recompute, whose discarded output goes to scratch).
  // --offload-checkpoints: two xs, x_l in xs[l % 2] (the block inputs are in the tier).
  // Host staging for a backend that is not host-accessible: page-aligned and pinned through
  // the backend (CUDA: cudaHostRegister) so upload/download are DMA; unpinned before freeing.
  struct HostBuf {
    float* p = nullptr;
    bool pinned = false;
  };
  std::vector<HostBuf> host_owned;

  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers();
  float* dev(size_t n);   // nullptr when out of memory (also recorded in `owned`)
  float* host(size_t n);  // nullptr when out of memory
  uint16_t* host_bf16(size_t n) { return reinterpret_cast<uint16_t*>(host((n + 1) / 2)); }
};

// The overlapped CPU optimizer of step s runs on its own thread while step s+1's pass starts.
// Layer l's shards of buffer nxt are gathered, and its gradient overwritten by the next
// reduce-scatter, only once the update of layer l is done: the passes wait on this progress
// (their wait counts as stall). Thread-safety: every field under `mu`.
struct OptProgress {
  std::mutex mu;
  std::condition_variable cv;
  int done = INT32_MAX;  // layers of the running update finished; all when none runs
  bool failed = false;
  void start();
  void layer_done(int l);
  void finish(bool ok);
  // False when the update failed (the pass must stop: the shard will not be written).
  bool wait_layer(int l);
};

struct Trainer;

// How one pass moves each layer: gathers its params before use, hands out the buffer its
// gradient is written to, reduce-scatters that gradient. HostPass (MPI on the comm thread,
// Backend::upload/download) and StreamPass (opts.stream: copies and collectives on the device)
// implement it; Trainer::forward/backward do the compute, the same for both.
class Pass {
 public:
  Pass(Trainer& t, const std::vector<Use>& uses, int cur, bool grad)
      : t_(t), uses_(uses), cur_(cur), grad_(grad) {}
  virtual ~Pass() = default;
  const std::vector<Use>& uses() const { return uses_; }
  bool grad() const { return grad_; }
  // Starts the gathers of the first K+1 uses.
  [[nodiscard]] virtual Status begin() = 0;
  // Use i's layer params, gathered [pad[layer]], on the device: fp32, or the bf16 working copy
  // when the pass's LayerStream hands the backend bf16 layers (Backend::bf16_params()).
  [[nodiscard]] virtual Result<LayerParams> params(size_t i) = 0;
  // The zeroed (or to-be-overwritten) device buffer layer's gradient is written to [pad[layer]].
  [[nodiscard]] virtual Result<float*> grad_buffer(int layer) = 0;
  // Reduce-scatters `g` (from grad_buffer(layer)) into the rank's grad shard, and takes the
  // shard's squared norm into t.grad_sumsq[layer].
  [[nodiscard]] virtual Status push_grad(int layer, float* g) = 0;
  // Use i is computed: its slot is free for the gather of use i + K + 1.
  [[nodiscard]] virtual Status done(size_t i) = 0;
  // Ends the pass (also after a failure `s`): waits for its collectives. Returns `s` if failed.
  [[nodiscard]] virtual Status end(Status s) = 0;

  float* g0 = nullptr;  // layer 0's gradient: open from the head to the embedding's backward

 protected:
  Trainer& t_;
  const std::vector<Use>& uses_;
  const int cur_;
  const bool grad_;
};

// One rank's training run: its geometry, buffers and the state of the step in progress.
// Lives on train()'s stack; every member function runs on the main thread except
// optimizer_step, which the overlapped update runs on its own thread (it touches only the
// store, `progress` and its arguments).
// A 64-bit FNV-1a hash of the store's marker_domain(): equal for ranks sharing a daemon.
uint64_t domain_hash(const ShardStore& store);
// Whether this rank writes its daemon's commit marker: the lowest rank of those whose store's
// marker_domain() is this one's. Collective.
[[nodiscard]] Result<bool> is_marker_writer(Comm& comm, const ShardStore& store);

struct Trainer {
  Trainer(const TrainOptions& opts, const Dataset& data, Comm& comm, Backend& be, ShardStore& store,
          std::FILE* out);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // setup.cpp
  [[nodiscard]] Status open_state();  // opens the store; initializes or resumes (sets start, marker_writer)
  [[nodiscard]] Status alloc_buffers();  // device buffers and host staging
  // reshard.cpp: --resume --reshard. Reads the state another rank count committed (every
  // daemon's marker agrees on it), re-slices it for this one, opens the store with it in the
  // committed step's buffer and sets start. Collective.
  [[nodiscard]] Status reshard_state(const StoreLayout& layout);
  // rollback.cpp: --resume. When a daemon rebuilt the job's pool after losing its RAM (a
  // reboot), rolls every daemon's pool back to the newest snapshot step all of them hold, so
  // the markers then agree; a no-op otherwise. Collective; before the store is opened.
  [[nodiscard]] Status roll_back_if_recovered();
  // After commit(step): the cut of --snapshot-every (every daemon's pool, tagged `step`).
  [[nodiscard]] Status snapshot_cut(int64_t step);
  void set_plan();  // the step's shard uses, told to tierd

  // trainer.cpp: one training step; rank 0 writes its JSON line.
  [[nodiscard]] Result<StepStats> step(int64_t step);

  // pass.cpp
  void load_batch(int64_t step);  // tokens, targets [B,T]
  std::unique_ptr<Pass> open_pass(const std::vector<Use>& uses, int cur, bool grad);
  [[nodiscard]] Status forward(Pass& p, double& loss);  // embed, blocks 1..L, head
  [[nodiscard]] Status backward(Pass& p);               // blocks L..1, embed
  [[nodiscard]] Result<double> validate_at(int cur);    // mean validation loss, all ranks
  float* x_at(int l) const;                             // x_l [B,T,C] (Buffers::xs)
  BlockActs acts_of(int l) const;                       // block l's activations (Buffers::acts)
  // --offload-checkpoints, forward: block l's input x_{l-1} [B,T,C] to its tensor in the tier.
  [[nodiscard]] Status save_block_input(int l);
  // --checkpoint-activations, backward: block l's input x_{l-1} [B,T,C] on the device (read
  // back from the tier when offloaded) and its activations recomputed from it with `params`.
  [[nodiscard]] Result<const float*> recompute_block(int l, LayerParams params);

  // update.cpp
  struct GradNorm {
    double norm = 0;      // global L2 norm of the step's gradient, before clipping
    double loss_sum = 0;  // the loss summed over the global batch's tokens
  };
  [[nodiscard]] Result<GradNorm> grad_norm(double rank_loss);  // one all-reduce
  AdamWStep adamw_step(int64_t step, double norm) const;       // schedule's lr, clip factor
  [[nodiscard]] Result<double> optimizer_step(int64_t step, int cur, int nxt, AdamWStep st);
  [[nodiscard]] Status update_and_commit(int64_t step, int cur, int nxt, AdamWStep st, double& opt_ms);
  void start_overlapped_update(int64_t step, int cur, int nxt, AdamWStep st);
  [[nodiscard]] Status finish_overlapped_update(double& opt_ms);
  [[nodiscard]] Status commit(int64_t step);
  // The shards an update reads from buffer `cur` besides the gradient, and writes to buffer
  // `nxt`, in the order of adamw_update's arguments. fp32: param, m, v (both). bf16: master,
  // m, v (reads); master, m, v, param (writes: the bf16 working copy).
  std::vector<ShardKind> opt_in_kinds() const;
  std::vector<ShardKind> opt_out_kinds() const;

  // --fault-step/--fault-point: SIGKILL this rank at a point of a step (restart tests).
  void fault_at(const char* point, int64_t step) const;
  void fault(const char* point) const { fault_at(point, cur_step); }

  const TrainOptions& opts;
  const ModelConfig& m;
  const Dataset& data;
  Comm& comm;
  Backend& be;
  ShardStore& store;
  std::FILE* out;

  const int R, rank, T, Bg, B, L, NL, K;
  const Dims d;
  const size_t BTC;                         // B * T * C
  std::vector<size_t> layer_n, pad, shard;  // per layer [NL]
  size_t max_pad = 0;
  const uint64_t hash;
  // Whether this rank writes its daemon's commit marker (one per daemon the job uses: the
  // lowest rank whose state that daemon holds). Set by open_state.
  bool marker_writer = false;
  const bool host;  // the backend's buffers are host memory
  // --checkpoint-activations, --offload-checkpoints (TrainOptions).
  const bool ckpt, offload_ckpt;
  const bool bf16;  // --precision bf16: bf16 param and grad shards, fp32 master, m, v
  // The CPU AdamW of step s runs on its own thread and lane (its own tierd client).
  const bool overlap_optimizer;
  const Lane opt_lane;
  // The loss is a mean over the global batch's tokens.
  const float loss_scale;
  const std::vector<Use> train_uses, eval_uses;
  const int64_t warmup;
  const int val_total;
  const double flops_step;
  int64_t start = 1;

  Buffers buf;
  std::vector<int32_t> tok_h, tgt_h;  // [B,T] host staging of the batch
  // Shards pinned by in-flight collectives; touched only on the comm thread.
  std::vector<Pinned> gather_pins, rs_pins;
  std::vector<double> grad_sumsq;  // [NL] this rank's grad shard's squared norm
  OptProgress progress;
  double stall_ms = 0;  // of the step in progress
  int64_t cur_step = 0;
  ShardStore::NvmeIo nvme_io_prev;
  // The overlapped update (declared last: its future's destructor waits for it, so no early
  // return leaves it running while the members it uses are destroyed).
  int64_t opt_job_step = 0;
  std::future<Result<double>> opt_job;
};

}  // namespace tier::train::detail
