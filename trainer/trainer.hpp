// The ZeRO-3 training loop of tier-train.
//
// Every layer's parameters are one flat buffer, padded to a multiple of 16 * R floats and cut
// into R equal shards; rank r owns shard r of every layer's params, grads and AdamW moments in
// its ShardStore. A step walks the layer "uses"
//
//   embed(0) fwd, block 1..L fwd, head(0) fwd+bwd, block L..1 bwd, embed(0) bwd
//
// and for each use all-gathers the layer's params into one of K+1 slots (K = --prefetch: the
// gathers of the next K uses are in flight while this one computes), computes, and frees the
// slot. Each backward use reduce-scatters the layer's gradient into the rank's grad shard.
// Then the global gradient norm is all-reduced, AdamW updates every shard, and the step is
// committed: a barrier, then the commit marker (see state.hpp) says the step is complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tier/status.hpp"
#include "trainer/backend.hpp"
#include "trainer/comm.hpp"
#include "trainer/data.hpp"
#include "trainer/layer_stream.hpp"
#include "trainer/model.hpp"
#include "trainer/optimizer.hpp"
#include "trainer/state.hpp"

namespace tier::train {

// AdamW over a range of a rank's shards somewhere else than this CPU (`--optimizer gpu`:
// trainer/cuda/gpu_optimizer.hpp). Same contract as adamw_update (outputs may alias the
// inputs); `step` is the 1-based optimizer step (bias correction). Called from the main thread
// only, with every span pinned until it returns.
class OffloadOptimizer {
 public:
  virtual ~OffloadOptimizer() = default;
  virtual const char* name() const = 0;
  [[nodiscard]] virtual Status update(const float* p, const float* m, const float* v, const float* g,
                                      float* p_out, float* m_out, float* v_out, size_t n, const AdamWStep& s,
                                      bool decay, int64_t step) = 0;
  // --precision bf16: adamw_update_bf16's contract (fp32 master p, m, v; bf16 gradient g; also
  // writes the bf16 working copy w_out = bf16(p_out)). kUnsupported unless overridden.
  [[nodiscard]] virtual Status update_bf16(const float* p, const float* m, const float* v, const uint16_t* g,
                                           float* p_out, float* m_out, float* v_out, uint16_t* w_out,
                                           size_t n, const AdamWStep& s, bool decay, int64_t step) {
    (void)p, (void)m, (void)v, (void)g, (void)p_out, (void)m_out, (void)v_out, (void)w_out, (void)n, (void)s,
        (void)decay, (void)step;
    return Status(Code::kUnsupported, std::string(name()) + " optimizer has no bf16 update");
  }
};

struct TrainOptions {
  ModelConfig model;
  int64_t steps = 20;
  uint64_t seed = 1337;
  int batch = 8;  // global sequences per step, split evenly across ranks
  int seq = 0;    // tokens per sequence; 0: model.seq
  // How blocks compute attention (--attention): flash (activations linear in seq) or the
  // materialized reference. Carried to the backend in every call's Dims.
  Attention attention = Attention::kFlash;
  AdamWConfig adamw;
  int64_t warmup = 0;  // 0: default_warmup(steps)
  float grad_clip = 1.0f;
  int64_t val_every = 0;  // 0: only after the last step; < 0: never
  int val_seqs = 0;       // validation sequences (rounded up to a multiple of batch); 0: batch
  int prefetch = 1;       // K
  int buffers = 1;        // 2: double-buffered param/m/v (restartable)
  // --precision bf16: bf16 params and grads in the store and the collectives, fp32 master
  // params and moments (docs/trainer.md, "Mixed precision"); every backend, collective and
  // optimizer path. tier-train's default with --backend cuda.
  Precision precision = Precision::kFp32;
  bool resume = false;    // continue from the store's committed step
  bool reshard = false;   // with resume: the state was committed by another rank count
  // After every N-th committed step, a snapshot of each daemon's pool tagged with the step (a
  // consistent cut across nodes; the previous cut is kept until the new one is durable
  // everywhere). 0: none. A --resume after a node lost its RAM rolls every node back to the
  // newest cut all hold (trainer/rollback.cpp).
  int64_t snapshot_every = 0;
  // --dump DIR: the parameters and gradient of the run's first `dump_steps` steps (dump.hpp).
  std::string dump_dir;
  int64_t dump_steps = 1;
  OffloadOptimizer* optimizer = nullptr;  // null: the CPU AdamW over the tier (adamw_update)
  // null: the host path (MPI on the comm thread, Backend::upload/download). Otherwise the
  // passes fetch, gather and reduce-scatter through it (--collectives nccl); train() opens it
  // on the store. Not owned; must outlive train().
  LayerStream* stream = nullptr;
  // The CPU AdamW of step s runs on its own thread beside step s+1's pass (docs/trainer.md).
  // Off by default: with the state on NVMe the two threads' interleaved leases defeat tierd's
  // plan (one cursor per client) and the step was slower (docs/benchmarks.md).
  bool overlap_optimizer = false;
  // Fault injection for the warm-restart tests: rank `fault_rank` kills itself (SIGKILL) in
  // step `fault_step` at `fault_point`: "forward", "backward", "optimizer" (after the first
  // layer's update), "precommit" (after the barrier, before the marker), "postcommit" or
  // "snapshot" (after --snapshot-every's cut of that step is durable on every node).
  int64_t fault_step = 0;
  int fault_rank = 0;
  std::string fault_point;
  // --checkpoint-activations: the forward keeps only each block's input x_{l-1} [B,T,C] and
  // writes every block's activations into one shared buffer; block l's backward first
  // recomputes its forward from x_{l-1}, with the parameters gathered for that backward. The
  // gradients are the same bit for bit; a step costs one more forward of the blocks.
  bool checkpoint_activations = false;
  // --offload-checkpoints (with checkpoint_activations, a tier store): the block inputs live in
  // the job's tierd pool, one tensor per block ("r0.l3.ckpt": ShardKind::kCkpt), written with
  // overwrite leases in forward and read in backward; the device keeps two [B,T,C] buffers.
  bool offload_checkpoints = false;
  // PCI address of the GPU this rank computes on ("" for the CPU backend): the tier state
  // places its shards near that GPU in tierd's numbering (trainer/gpu_map.hpp).
  std::string gpu_pci;
};

struct StepStats {
  int64_t step = 0;
  double loss = 0, ms = 0, tokens_per_s = 0, tflops = 0, stall_ms = 0, opt_ms = 0;
  double grad_norm = 0;  // global L2 norm of the step's gradient, before clipping
  double val_loss = -1;  // < 0: not computed this step
  // Parameter bytes the LayerStream copied host to device during the step, per second of the
  // step (GB/s); < 0 on the host path, which does not count them (the step line says null).
  double h2d_gbps = -1;
};

struct RunSummary {
  int64_t first_step = 0, last_step = 0;
  double first_loss = 0, last_loss = 0, last_val_loss = -1;
  double mean_ms = 0, mean_tokens_per_s = 0, mean_tflops = 0, mean_stall_ms = 0, mean_opt_ms = 0;
  uint64_t activation_bytes = 0;  // per rank, as allocated (activation_floats)
};

// Floats of activation memory one rank's buffers hold for a step of d.B sequences of d.T
// tokens through `layers` blocks (the trainer allocates exactly this; trainer/setup.cpp):
// the residual stream x_0..x_L [B,T,C], the block activations (one BlockActs per block, or
// checkpointed one shared), the head's, the backward's scratch and the gradient dx [B,T,C].
// Offloaded checkpoints leave two [B,T,C] buffers of the residual stream on the device.
//   without: (L+1) * BTC + L * block_acts + head + scratch + BTC
//   checkpointed: (L+1) * BTC + 1 * block_acts + head + scratch + BTC
size_t activation_floats(const Dims& d, int layers, bool checkpoint, bool offload = false);

// Runs the training (the step's parts: trainer/step.hpp); rank 0 writes one JSON line per step
// to `out` (others write nothing).
// Returns the summary (the same on every rank).
[[nodiscard]] Result<RunSummary> train(const TrainOptions& opts, const Dataset& data, Comm& comm,
                                       Backend& backend, ShardStore& store, std::FILE* out);

// kInvalidArgument naming the first option --precision bf16 does not run with (--reshard and
// --dump, which read and write fp32 state); ok otherwise. train() checks it, and tier-train
// before it starts.
[[nodiscard]] Status check_precision(const TrainOptions& opts);

// The hash a commit marker carries: the model, rank count, batch, seq, seed and buffering.
uint64_t run_config_hash(const TrainOptions& opts, int ranks);

}  // namespace tier::train
