// tier-train --plan: memory per tier and the bandwidth-bound step time of a ZeRO-3 run with
// its state offloaded to host RAM (and NVMe when RAM is short), on paper. The bytes are the
// trainer's (memory_model.hpp): a run with the same options puts exactly the planned state in
// its pool. The model of the
// machine and its assumptions are documented in docs/scaling.md; defaults describe one Azure
// NDm A100 v4 node.
#pragma once

#include <string>

#include "tier/status.hpp"
#include "tier/types.hpp"
#include "trainer/memory_model.hpp"
#include "trainer/model.hpp"

namespace CLI {
class App;
}

namespace tier::train {

struct PlanOptions {
  ModelConfig model;
  int nodes = 1;
  int gpus_per_node = 8;
  std::string gpu_mem = "80G";       // per GPU
  double gpu_tflops = 312;           // peak dense bf16 TFLOP/s per GPU
  std::string host_ram = "1.7T";     // per node
  double ram_frac = 0.8;             // share of host RAM the tier may use
  std::string nvme_capacity = "6T";  // per node
  double nvme_gbps = 12;             // per node, GB/s (read = write assumed)
  double pcie_gbps = 25;             // per GPU, host <-> GPU, GB/s
  double net_gbps = 25;              // per GPU, inter-node (200 Gb/s InfiniBand), GB/s
  double nvlink_gbps = 250;          // per GPU, intra-node collectives, GB/s
  double host_mem_gbps = 200;        // per node, what the CPU optimizer streams at, GB/s
  int micro_batch = 8;               // sequences per GPU per step
  int seq = 0;                       // 0: model.seq
  // The run's own options (the same flags as a run's; see MemoryConfig).
  int prefetch = 1;
  int buffers = 2;
  Precision precision = Precision::kFp32;  // --precision
  bool checkpointing = false;              // --checkpoint-activations
  bool offload_checkpoints = false;        // --offload-checkpoints
  bool flash_attention = true;             // --attention flash (the default) or reference
  bool device_pipeline = false;            // --backend cuda --collectives nccl|auto (MemoryConfig)
};

struct Plan {
  PlanOptions o;
  uint64_t params = 0;
  int ranks = 0;
  // Bytes. The state and the device working set are the trainer's own (memory_model()).
  MemoryModel mem;
  double state_total = 0, state_rank = 0, state_node = 0;  // ZeRO-3 sharded, checkpoints included
  double gpu_params = 0, gpu_acts = 0, gpu_ckpt = 0, gpu_total = 0, gpu_mem = 0;
  bool ckpt_on_host = false;  // --offload-checkpoints: the checkpoints are in the node's tier
  double ram_node = 0, ram_rank = 0, ram_capacity = 0;
  double nvme_node = 0, nvme_rank = 0, nvme_capacity = 0;
  bool fits = true;
  std::string why_not;
  // Per step.
  double tokens_gpu = 0, model_flops_gpu = 0, hw_flops_gpu = 0;
  double compute_s = 0, net_s = 0, pcie_s = 0, nvme_s = 0, optimizer_s = 0, step_s = 0;
  std::string bound;
  double tflops_gpu = 0;  // model FLOPs / step_s
};

void add_plan_options(CLI::App& app, PlanOptions& o);
[[nodiscard]] Result<Plan> make_plan(const PlanOptions& o);
std::string plan_text(const Plan& p);
std::string plan_json(const Plan& p);

}  // namespace tier::train
