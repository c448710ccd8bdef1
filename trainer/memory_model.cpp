#include "trainer/memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tier/types.hpp"
#include "trainer/step.hpp"
#include "wire/errors.hpp"

namespace tier::train {

namespace {
size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }
}  // namespace

ShardGeometry shard_geometry(const ModelConfig& m, int ranks) {
  ShardGeometry g;
  const int NL = m.num_layers();
  const size_t R = static_cast<size_t>(std::max(ranks, 1));
  g.layer_floats.resize(NL);
  g.pad.resize(NL);
  g.shard.resize(NL);
  for (int l = 0; l < NL; ++l) {
    g.layer_floats[l] = m.layer_floats(l);
    g.pad[l] = round_up(g.layer_floats[l], 16 * R);
    g.shard[l] = g.pad[l] / R;
    g.max_pad = std::max(g.max_pad, g.pad[l]);
  }
  return g;
}

std::vector<ShardRef> layer_shards(int layer, int buffers, Precision precision) {
  std::vector<ShardRef> refs;
  for (ShardKind k :
       {ShardKind::kParam, ShardKind::kM, ShardKind::kV, ShardKind::kGrad, ShardKind::kMaster}) {
    const int copies = k == ShardKind::kGrad                                      ? 1
                       : k == ShardKind::kMaster && precision != Precision::kBf16 ? 0
                                                                                  : buffers;
    for (int b = 0; b < copies; ++b) refs.push_back({layer, k, b});
  }
  return refs;
}

Result<MemoryModel> memory_model(const MemoryConfig& c) {
  if (auto s = validate(c.model); !s) return fail(s);
  const int T = c.seq > 0 ? c.seq : c.model.seq;
  if (c.ranks < 1 || c.ranks_per_node < 1 || c.ranks_per_node > c.ranks)
    return fail(
        Code::kInvalidArgument,
        fmt::format("{} rank(s) with {} per node: need 1 <= per node <= ranks", c.ranks, c.ranks_per_node));
  if (c.micro_batch < 1 || T < 1 || T > c.model.seq)
    return fail(Code::kInvalidArgument,
                fmt::format("micro-batch {} and seq {} must be >= 1, seq at most the model's {}",
                            c.micro_batch, T, c.model.seq));
  if (c.buffers != 1 && c.buffers != 2) return fail(Code::kInvalidArgument, "buffers must be 1 or 2");
  if (c.offload_checkpoints && !c.checkpoint_activations)
    return fail(Code::kInvalidArgument, "offloaded checkpoints need activation checkpointing");

  MemoryModel mm;
  mm.config = c;
  mm.config.seq = T;
  mm.precision = precision_name(c.precision);
  mm.geometry = shard_geometry(c.model, c.ranks);
  const ShardGeometry& g = mm.geometry;
  const int L = c.model.layers, NL = c.model.num_layers();
  const size_t B = static_cast<size_t>(c.micro_batch), C = static_cast<size_t>(c.model.dim);
  const size_t BTC = B * static_cast<size_t>(T) * C;

  // The store: every tensor rank_shards() names, charged as tierd charges it.
  TierBytes& r = mm.rank;
  for (int l = 0; l < NL; ++l) {
    for (const ShardRef& ref : layer_shards(l, c.buffers, c.precision)) {
      (ref.kind == ShardKind::kParam    ? r.params
       : ref.kind == ShardKind::kGrad   ? r.grads
       : ref.kind == ShardKind::kMaster ? r.masters
                                        : r.moments) +=
          tensor_charge(g.shard[l] * shard_elem_bytes(ref.kind, c.precision));
      ++r.tensors;
    }
  }
  if (c.offload_checkpoints) {
    r.checkpoints = static_cast<uint64_t>(L) * tensor_charge(BTC * sizeof(float));
    r.tensors += static_cast<uint64_t>(L);
  }
  const auto per_node = static_cast<uint64_t>(c.ranks_per_node);
  mm.node.params = r.params * per_node;
  mm.node.masters = r.masters * per_node;
  mm.node.grads = r.grads * per_node;
  mm.node.moments = r.moments * per_node;
  mm.node.checkpoints = r.checkpoints * per_node;
  mm.node.marker = tensor_charge(sizeof(CommitMarker));
  mm.node.tensors = r.tensors * per_node + 1;
  const double node_params = static_cast<double>(c.model.num_params()) * c.ranks_per_node / c.ranks;
  mm.state_bytes_per_param =
      static_cast<double>(mm.node.params + mm.node.masters + mm.node.grads + mm.node.moments) /
      std::max(node_params, 1.0);

  // The device: what Trainer::alloc_buffers allocates (host-accessible backends use the same
  // buffers as host memory).
  const Dims d =
      c.model.dims(c.micro_batch, T, c.flash_attention ? Attention::kFlash : Attention::kReference);
  DeviceBytes& dv = mm.device;
  constexpr uint64_t f = sizeof(float);
  dv.gathered = static_cast<uint64_t>(c.prefetch + 1) * g.max_pad * f;
  dv.grads = (g.pad[0] + 2 * (NL > 1 ? g.pad[1] : 1)) * f;
  uint64_t backend_scratch = 0;
  if (c.device_pipeline) {
    // LayerPipeline's slots (make_slot) for the largest shard, K + 1 per direction, and
    // PipelineStream's layer 0 gradient.
    const uint64_t depth = static_cast<uint64_t>(c.prefetch) + 1;
    const uint64_t shard = *std::max_element(g.shard.begin(), g.shard.end());
    const bool bf16 = c.precision == Precision::kBf16;
    constexpr uint64_t h = 2;
    dv.gathered = depth * (bf16 ? (shard + g.max_pad) * h : (shard + g.max_pad) * f);
    dv.grads = g.pad[0] * f + depth * (g.max_pad * f + (bf16 ? (shard + g.max_pad) * h : shard * f));
    if (bf16)  // CudaBackend: act16_, vec_, wide_
      backend_scratch = BTC * 4 * h + 13 * C * f + embed_layout(c.model.dims(1, T)).total * f;
  } else if (c.precision == Precision::kBf16) {
    // Host staging of the bf16 collectives: the gathered shards of each slot, and per gradient
    // buffer its bf16 copy and the all-to-all's chunks (Trainer::alloc_buffers).
    constexpr uint64_t h = 2;
    dv.gathered += static_cast<uint64_t>(c.prefetch + 1) * g.max_pad * h;
    dv.grads += 2 * (g.pad[0] + 2 * (NL > 1 ? g.pad[1] : 1)) * h;
  }
  // The activation buffers as the trainer counts them (activation_counts, setup.cpp).
  const detail::ActivationCounts n =
      detail::activation_counts(d, L, c.checkpoint_activations, c.offload_checkpoints);
  dv.activations = static_cast<uint64_t>(n.acts) * block_acts_floats(d) * f;
  dv.checkpoints = static_cast<uint64_t>(n.xs) * BTC * f;
  dv.head = head_acts_floats(d) * f;
  dv.scratch = (n.scratch + BTC) * f + 2 * B * static_cast<uint64_t>(T) * sizeof(int32_t) +  // + dx, tokens
               backend_scratch;
  return mm;
}

}  // namespace tier::train
