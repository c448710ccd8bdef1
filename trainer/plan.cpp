#include "trainer/plan.hpp"
#include "wire/errors.hpp"
#include "wire/sizes.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace tier::train {

void add_plan_options(CLI::App& app, PlanOptions& o) {
  auto* g = app.add_option_group("plan", "--plan: the node and run on paper");
  g->add_option("--nodes", o.nodes, "nodes")->capture_default_str();
  g->add_option("--gpus-per-node", o.gpus_per_node, "GPUs (ranks) per node")->capture_default_str();
  g->add_option("--gpu-mem", o.gpu_mem, "memory per GPU")->capture_default_str();
  g->add_option("--gpu-tflops", o.gpu_tflops, "peak TFLOP/s per GPU")->capture_default_str();
  g->add_option("--host-ram", o.host_ram, "host RAM per node")->capture_default_str();
  g->add_option("--ram-frac", o.ram_frac, "share of host RAM for the tier")->capture_default_str();
  g->add_option("--nvme-capacity", o.nvme_capacity, "NVMe per node")->capture_default_str();
  g->add_option("--nvme-bw", o.nvme_gbps, "NVMe GB/s per node")->capture_default_str();
  g->add_option("--pcie-bw", o.pcie_gbps, "host<->GPU GB/s per GPU")->capture_default_str();
  g->add_option("--net-bw", o.net_gbps, "inter-node GB/s per GPU")->capture_default_str();
  g->add_option("--nvlink-bw", o.nvlink_gbps, "intra-node GB/s per GPU")->capture_default_str();
  g->add_option("--host-mem-bw", o.host_mem_gbps, "host memory GB/s per node (CPU optimizer)")
      ->capture_default_str();
  g->add_option("--micro-batch", o.micro_batch, "sequences per GPU per step")->capture_default_str();
}

Result<Plan> make_plan(const PlanOptions& in) {
  Plan p;
  p.o = in;
  const PlanOptions& o = p.o;
  if (o.nodes < 1 || o.gpus_per_node < 1 || o.micro_batch < 1 || o.gpu_tflops <= 0)
    return fail(Code::kInvalidArgument,
                "--nodes, --gpus-per-node, --micro-batch, --gpu-tflops must be positive");
  auto gm = parse_size(o.gpu_mem);
  auto hr = parse_size(o.host_ram);
  auto nc = parse_size(o.nvme_capacity);
  if (!gm) return fail(gm.error());
  if (!hr) return fail(hr.error());
  if (!nc) return fail(nc.error());
  const ModelConfig& m = o.model;
  const MemoryConfig mc{.model = m,
                        .ranks = o.nodes * o.gpus_per_node,
                        .ranks_per_node = o.gpus_per_node,
                        .micro_batch = o.micro_batch,
                        .seq = o.seq,
                        .buffers = o.buffers,
                        .prefetch = o.prefetch,
                        .precision = o.precision,
                        .checkpoint_activations = o.checkpointing,
                        .offload_checkpoints = o.offload_checkpoints,
                        .flash_attention = o.flash_attention,
                        .device_pipeline = o.device_pipeline};
  auto mm = memory_model(mc);
  if (!mm) return fail(mm.error());
  p.mem = *mm;
  const double T = p.mem.config.seq;
  const double b = o.micro_batch;
  const double P = static_cast<double>(m.num_params());
  const double N = static_cast<double>(o.nodes) * o.gpus_per_node;
  p.params = m.num_params();
  p.ranks = o.nodes * o.gpus_per_node;

  // State: the tensors a run creates in each node's pool (params, grads, AdamW moments and,
  // bf16, fp32 masters, in `buffers` copies; offloaded checkpoints), as tierd charges them.
  p.state_node = static_cast<double>(p.mem.node.total());
  p.state_total = p.state_node * o.nodes;
  p.state_rank = static_cast<double>(p.mem.rank.total());

  // GPU working set: the trainer's own buffers (K+1 gathered layers, the gradient buffers,
  // the saved activations, the residual stream checkpoints, the head and scratch).
  const DeviceBytes& dv = p.mem.device;
  p.gpu_mem = static_cast<double>(*gm);
  p.gpu_params = static_cast<double>(dv.gathered + dv.grads);
  p.gpu_acts = static_cast<double>(dv.activations + dv.head + dv.scratch);
  p.gpu_ckpt = static_cast<double>(dv.checkpoints);
  p.gpu_total = static_cast<double>(dv.total());
  p.ckpt_on_host = o.offload_checkpoints;

  // Host RAM takes the node's pool up to ram_frac of RAM; the rest spills to NVMe.
  p.ram_capacity = static_cast<double>(*hr) * o.ram_frac;
  p.ram_node = std::min(p.state_node, p.ram_capacity);
  p.nvme_node = std::max(0.0, p.state_node - p.ram_capacity);
  p.ram_rank = p.ram_node / o.gpus_per_node;
  p.nvme_rank = p.nvme_node / o.gpus_per_node;
  p.nvme_capacity = static_cast<double>(*nc);
  if (p.gpu_total > p.gpu_mem) {
    p.fits = false;
    p.why_not = fmt::format("GPU working set {} exceeds GPU memory {}",
                            format_size(static_cast<uint64_t>(p.gpu_total)), o.gpu_mem);
  } else if (p.nvme_node > p.nvme_capacity) {
    p.fits = false;
    p.why_not = fmt::format("state spills {} per node to NVMe, more than its {}",
                            format_size(static_cast<uint64_t>(p.nvme_node)), o.nvme_capacity);
  }

  // Per step and GPU.
  p.tokens_gpu = b * T;
  p.model_flops_gpu = m.flops_per_token(static_cast<int>(T)) * p.tokens_gpu;
  // Checkpointing recomputes the forward once more: 8 instead of 6 FLOPs per param and token.
  p.hw_flops_gpu = p.model_flops_gpu * (o.checkpointing ? 8.0 / 6.0 : 1.0);
  p.compute_s = p.hw_flops_gpu / (o.gpu_tflops * 1e12);
  // ZeRO-3 moves the params twice (all-gather in forward and in backward) and the grads once
  // (reduce-scatter): 3 * wP * (N-1)/N bytes through each GPU's link (w = 4 fp32, 2 bf16);
  // inter-node links when nodes > 1, NVLink otherwise.
  const double kWord = o.precision == Precision::kBf16 ? 2.0 : 4.0;
  const double coll = 3.0 * kWord * P * (N - 1) / N;
  p.net_s = coll / ((o.nodes > 1 ? o.net_gbps : o.nvlink_gbps) * 1e9);
  // PCIe per GPU: its param shard up twice, its grad shard down once, and the checkpoints
  // down and up when they live in the tier.
  const double pcie_bytes =
      3.0 * kWord * P / N + (p.ckpt_on_host ? 2.0 * static_cast<double>(p.mem.rank.checkpoints) : 0.0);
  p.pcie_s = pcie_bytes / (o.pcie_gbps * 1e9);
  // NVMe per node: the spilled part of the pool is read and written once per step.
  p.nvme_s = 2.0 * p.nvme_node / (o.nvme_gbps * 1e9);
  // CPU AdamW: reads p, m, v, g and writes p, m, v, all fp32: 28 B/param (bf16: reads the
  // fp32 master, m, v and the bf16 g, writes them and the bf16 param: 28 B/param too).
  p.optimizer_s = 28.0 * P / o.nodes / (o.host_mem_gbps * 1e9);
  struct T2 {
    const char* n;
    double s;
  };
  const T2 terms[] = {{"compute", p.compute_s},
                      {"network", p.net_s},
                      {"pcie", p.pcie_s},
                      {"nvme", p.nvme_s},
                      {"cpu-optimizer", p.optimizer_s}};
  p.step_s = 0;
  for (const auto& t : terms)
    if (t.s > p.step_s) {
      p.step_s = t.s;
      p.bound = t.n;
    }
  p.tflops_gpu = p.model_flops_gpu / p.step_s / 1e12;
  return p;
}

namespace {
std::string sz(double b) { return format_size(static_cast<uint64_t>(b)); }
}  // namespace

std::string plan_text(const Plan& p) {
  const auto& o = p.o;
  std::string s;
  s += fmt::format("model {} on {} node(s) x {} GPU(s) = {} ranks; micro-batch {} x {} tokens per GPU\n",
                   o.model.describe(), o.nodes, o.gpus_per_node, p.ranks, o.micro_batch,
                   o.seq > 0 ? o.seq : o.model.seq);
  s += fmt::format("trainer: {} precision, activation checkpointing {}{}, {} attention, {} buffer(s)\n",
                   p.mem.precision, o.checkpointing ? "on" : "off",
                   o.offload_checkpoints ? " (checkpoints in the tier)" : "",
                   o.flash_attention ? "flash" : "reference", o.buffers);
  const TierBytes& n = p.mem.node;
  s += fmt::format("state ({:.1f} B/param, ZeRO-3): total {}, per node {}, per rank {}\n",
                   p.mem.state_bytes_per_param, sz(p.state_total), sz(p.state_node), sz(p.state_rank));
  s += fmt::format(
      "pool per node: params {}, masters {}, grads {}, moments {}, checkpoints {}, marker {} ({} tensors)\n",
      sz(n.params), sz(n.masters), sz(n.grads), sz(n.moments), sz(n.checkpoints), sz(n.marker), n.tensors);
  s += fmt::format(
      "GPU per rank: {} of {} (gathered layers and gradients {}, activations {}, residual stream {})\n",
      sz(p.gpu_total), o.gpu_mem, sz(p.gpu_params), sz(p.gpu_acts), sz(p.gpu_ckpt));
  s += fmt::format("RAM:  per node {} of {} usable, per rank {}\n", sz(p.ram_node), sz(p.ram_capacity),
                   sz(p.ram_rank));
  s += fmt::format("NVMe: per node {} of {}, per rank {}\n", sz(p.nvme_node), sz(p.nvme_capacity),
                   sz(p.nvme_rank));
  s += fmt::format(
      "step: compute {:.4g} s, network {:.4g} s, pcie {:.4g} s, nvme {:.4g} s, "
      "cpu optimizer {:.4g} s -> {:.4g} s ({}-bound)\n",
      p.compute_s, p.net_s, p.pcie_s, p.nvme_s, p.optimizer_s, p.step_s, p.bound);
  s += fmt::format("bound: {:.1f} TFLOP/s per GPU ({:.0f}% of {:.0f} peak), {:.0f} tokens/s per GPU\n",
                   p.tflops_gpu, 100.0 * p.tflops_gpu / o.gpu_tflops, o.gpu_tflops, p.tokens_gpu / p.step_s);
  s += p.fits ? "fits: yes\n" : fmt::format("fits: no: {}\n", p.why_not);
  return s;
}

std::string plan_json(const Plan& p) {
  const auto& o = p.o;
  nlohmann::json j;
  j["model"] = o.model.name;
  j["layers"] = o.model.layers;
  j["dim"] = o.model.dim;
  j["heads"] = o.model.heads;
  j["seq"] = o.seq > 0 ? o.seq : o.model.seq;
  j["params"] = p.params;
  j["nodes"] = o.nodes;
  j["gpus_per_node"] = o.gpus_per_node;
  j["ranks"] = p.ranks;
  j["micro_batch"] = o.micro_batch;
  j["precision"] = p.mem.precision;
  j["checkpoint_activations"] = o.checkpointing;
  j["offload_checkpoints"] = o.offload_checkpoints;
  j["attention"] = o.flash_attention ? "flash" : "reference";
  j["buffers"] = o.buffers;
  j["state_bytes"] = {{"total", p.state_total},
                      {"per_node", p.state_node},
                      {"per_rank", p.state_rank},
                      {"per_param", p.mem.state_bytes_per_param}};
  // Integers, byte for byte what tierd reports for the job's pool (tierctl --json pools).
  auto tier_json = [](const TierBytes& t) {
    return nlohmann::json{{"params", t.params},
                          {"masters", t.masters},
                          {"grads", t.grads},
                          {"moments", t.moments},
                          {"checkpoints", t.checkpoints},
                          {"marker", t.marker},
                          {"tensors", t.tensors},
                          {"total", t.total()}};
  };
  j["pool_bytes"] = {{"per_rank", tier_json(p.mem.rank)}, {"per_node", tier_json(p.mem.node)}};
  j["gpu_bytes_per_rank"] = {
      {"total", p.gpu_total},          {"gathered_layers", p.gpu_params},       {"activations", p.gpu_acts},
      {"residual_stream", p.gpu_ckpt}, {"checkpoints_on_host", p.ckpt_on_host}, {"capacity", p.gpu_mem}};
  j["ram_bytes"] = {
      {"per_node", p.ram_node}, {"per_rank", p.ram_rank}, {"capacity_per_node", p.ram_capacity}};
  j["nvme_bytes"] = {
      {"per_node", p.nvme_node}, {"per_rank", p.nvme_rank}, {"capacity_per_node", p.nvme_capacity}};
  j["step_s"] = {
      {"compute", p.compute_s},         {"network", p.net_s}, {"pcie", p.pcie_s}, {"nvme", p.nvme_s},
      {"cpu_optimizer", p.optimizer_s}, {"bound", p.step_s}};
  j["bound"] = p.bound;
  j["tflops_per_gpu"] = p.tflops_gpu;
  j["tokens_per_s_per_gpu"] = p.tokens_gpu / p.step_s;
  j["fits"] = p.fits;
  if (!p.fits) j["why_not"] = p.why_not;
  return j.dump() + "\n";
}

}  // namespace tier::train
