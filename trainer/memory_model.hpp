// The bytes tier-train puts in each place: the shards each rank keeps in its store (tierd's
// pool or private memory) and the working set on its compute device. One function,
// memory_model(), that both `--plan` and a run use: the run sizes its shards with
// shard_geometry() and creates the tensors rank_shards() lists, and the plan adds up the same
// list, each tensor charged as tierd charges it (tier::tensor_charge). So what `--plan --json`
// prints for a configuration is what tierd reports for the job's pool once it runs.
//
// Precision (MemoryConfig::precision): fp32 everywhere (parameters, gradients, AdamW moments;
// the parameters are their own master copy), or bf16 (bf16 parameters and gradients, fp32
// master parameters and moments; bf16 staging of the gathers and reduce-scatters). Shapes: B sequences per
// rank, T tokens, C width, L blocks, NL = L + 1 layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/model.hpp"
#include "trainer/state.hpp"

namespace tier::train {

// The options of a run that decide its memory. A run and `--plan` fill it from the same
// command-line options.
struct MemoryConfig {
  ModelConfig model;
  int ranks = 1;           // R, all nodes
  int ranks_per_node = 1;  // ranks sharing one tierd (one pool per node)
  int micro_batch = 1;     // B: sequences per rank per step
  int seq = 0;             // T; 0: model.seq
  int buffers = 2;         // copies of param, m and v (2: double-buffered, restartable)
  int prefetch = 1;        // K: layers gathered ahead of compute
  Precision precision = Precision::kFp32;
  // The device keeps each block's input only and recomputes the block in its backward.
  bool checkpoint_activations = false;
  // The checkpoints (each block's input) live in the job's pool instead (needs the above).
  bool offload_checkpoints = false;
  // Attention scores: materialized [B,NH,T,T] (reference) or never held (flash).
  bool flash_attention = true;
  // The device's layer pipeline moves the layers (--backend cuda --collectives nccl:
  // trainer/cuda/pipeline.hpp) instead of the trainer's host path. Its slots are device
  // buffers; with bf16 the backend computes from the gathered bf16 layers, so a parameter slot
  // holds no fp32 copy.
  bool device_pipeline = false;
};

// Every layer's parameters padded to a multiple of 16 * R floats (whole 64-byte lines per
// shard) and cut into R equal shards.
struct ShardGeometry {
  std::vector<size_t> layer_floats;  // [NL] unpadded
  std::vector<size_t> pad;           // [NL] padded
  std::vector<size_t> shard;         // [NL] pad / R: what one rank owns of each layer
  size_t max_pad = 0;
};
ShardGeometry shard_geometry(const ModelConfig& m, int ranks);

// The shards one rank keeps for a layer: param, m and v in `buffers` copies, and one grad;
// bf16 adds the fp32 master params in `buffers` copies. Each is shard[layer] elements of
// shard_elem_bytes(kind, precision) bytes.
std::vector<ShardRef> layer_shards(int layer, int buffers, Precision precision = Precision::kFp32);

// Bytes, by what they hold.
struct TierBytes {
  uint64_t params = 0;       // parameters (fp32, or bf16 working copies), all copies
  uint64_t masters = 0;      // bf16: the fp32 master parameters, all copies
  uint64_t grads = 0;        // gradient shards (fp32 or bf16)
  uint64_t moments = 0;      // AdamW m and v, all copies
  uint64_t checkpoints = 0;  // offloaded block inputs (--offload-checkpoints)
  uint64_t marker = 0;       // the job's commit marker (one per pool)
  uint64_t tensors = 0;      // how many tensors
  uint64_t total() const { return params + masters + grads + moments + checkpoints + marker; }
};

// The device working set of one rank, from the buffers the trainer allocates (step.hpp).
struct DeviceBytes {
  // Host path: K + 1 fp32 parameter slots of the largest layer (bf16: and their bf16 staging);
  // pipeline: K + 1 slots of the shard and the gathered layer, bf16 only with bf16.
  uint64_t gathered = 0;
  // Host path: layer 0's gradient and two block gradients (bf16: and their bf16 staging);
  // pipeline: layer 0's fp32 gradient and K + 1 slots of an fp32 layer gradient and its
  // shard (bf16: the bf16 layer and shard the reduce-scatter moves instead of the fp32 shard).
  uint64_t grads = 0;
  uint64_t activations = 0;  // saved block activations (L blocks, or one when checkpointing)
  uint64_t checkpoints = 0;  // the residual stream x_0..x_L (two buffers when offloaded)
  uint64_t head = 0;         // lnf and logits
  // A block's backward scratch, dx, tokens and targets; pipeline with bf16: the backend's bf16
  // GEMM operand [B,T,4C], a block's widened vectors and layer 0 widened (fp32).
  uint64_t scratch = 0;
  uint64_t total() const { return gathered + grads + activations + checkpoints + head + scratch; }
};

struct MemoryModel {
  MemoryConfig config;
  ShardGeometry geometry;
  const char* precision = "fp32";
  TierBytes rank;  // one rank's tensors (the marker not included)
  TierBytes node;  // one pool: ranks_per_node ranks and the marker
  DeviceBytes device;
  double state_bytes_per_param = 0;  // node.total() over the node's share of the parameters
};

// Fails (kInvalidArgument) on a configuration no run accepts: no ranks, B or T out of range,
// offloaded checkpoints without checkpointing.
[[nodiscard]] Result<MemoryModel> memory_model(const MemoryConfig& c);

}  // namespace tier::train
