// --resume --reshard: the job's state, committed by R0 ranks, re-sliced for this run's R.
//
// ZeRO-3 keeps layer l's params, m and v as one flat array padded to pad0 = a multiple of
// 16 * R0, rank q holding [q * pad0 / R0, (q + 1) * pad0 / R0). Re-slicing is a copy: each
// daemon's marker writer reads the old shards its daemon holds (of the committed step's
// buffer), the job sums the layer (every element comes from exactly one old shard, the others
// add zeros, so the sum is that element, bit for bit) and each rank keeps its new slice. Then
// the store is opened for R ranks (old shards of a rank this daemon still serves are
// replaced, the others deleted), the slices are written to the committed step's buffer, and the markers
// say that step for R ranks.
//
// Memory: one layer's three full arrays per rank at a time (doubles, for the sum), plus this
// rank's new slices of every layer until the store is open. Not crash-safe in its second half:
// a rank killed after the store was reopened leaves neither layout whole (the markers are
// invalid then, so a later --resume refuses instead of training on it).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "trainer/step.hpp"

namespace tier::train::detail {

namespace {

constexpr ShardKind kStateKinds[] = {ShardKind::kParam, ShardKind::kM, ShardKind::kV};

// MPI counts are ints: sum long arrays in pieces.
Status allreduce_sum_long(Comm& comm, std::vector<double>& v) {
  constexpr size_t kPiece = size_t{1} << 24;
  for (size_t off = 0; off < v.size(); off += kPiece)
    if (auto s = comm.allreduce_sum(v.data() + off, static_cast<int>(std::min(kPiece, v.size() - off))); !s)
      return s;
  return {};
}

}  // namespace

Status Trainer::reshard_state(const StoreLayout& layout) {
  auto writer = is_marker_writer(comm, store);
  if (!writer) return writer.error();
  marker_writer = *writer;
  auto domains = comm.allgather(domain_hash(store));  // which new ranks share this daemon
  if (!domains) return domains.error();

  // Every daemon's marker: written by one run of this job on some rank count R0.
  // A rank that cannot read its marker says so in the vote and fails after it, so that no
  // rank is left waiting in the collective.
  auto mk = store.read_marker();
  const bool valid = mk && mk->magic == CommitMarker::kMagic && mk->ranks > 0 && mk->ranks < (1u << 20);
  const double r0 = valid ? static_cast<double>(mk->ranks) : 0.0;
  const double step = valid ? static_cast<double>(mk->step) : 0.0;
  double v[5] = {valid ? 0.0 : 1.0, r0, -r0, step, -step};  // any bad, R0 max/min, newest, -oldest
  if (auto s = comm.allreduce_max(v, 5); !s) return s;
  if (!mk) return mk.error();
  if (v[0] != 0.0)
    return Status(Code::kInvalidArgument,
                  "--resume --reshard: not every daemon the job uses has a commit marker of it");
  if (v[1] != -v[2])
    return Status(Code::kInvalidArgument,
                  fmt::format("--resume --reshard: the daemons' markers name {} and {} ranks", -v[2], v[1]));
  const int R0 = static_cast<int>(v[1]);
  const auto newest = static_cast<int64_t>(v[3]), oldest = static_cast<int64_t>(-v[4]);
  const uint64_t hash0 = run_config_hash(opts, R0);
  uint64_t bad_hash = valid && mk->config_hash != hash0 ? 1 : 0;
  auto bad = comm.allgather(bad_hash);
  if (!bad) return bad.error();
  for (uint64_t b : *bad)
    if (b != 0)
      return Status(Code::kInvalidArgument,
                    fmt::format("--resume --reshard: the job's state was not written by this model, "
                                "batch and seed on {} ranks",
                                R0));
  if (newest - oldest > 1)
    return Status(Code::kInvalidArgument,
                  fmt::format("--resume --reshard: the daemons' commit markers say steps {} to {}; "
                              "no step is held by all",
                              oldest, newest));
  if (newest < 1) return Status(Code::kInvalidArgument, "--resume --reshard: the job never committed a step");
  // The newest step's buffer is complete on every old rank (see commit in update.cpp).
  const int b = static_cast<int>(newest % 2);

  // Re-slice layer by layer; keep this rank's new slices.
  std::vector<std::vector<float>> mine(static_cast<size_t>(NL) * 3);
  for (int l = 0; l < NL; ++l) {
    const size_t pad0 = round_up(layer_n[l], 16 * static_cast<size_t>(R0)), sh0 = pad0 / R0;
    std::vector<float> piece(sh0);
    for (int k = 0; k < 3; ++k) {
      std::vector<double> full(pad0 + 1, 0.0);  // the last: how many old shards were found
      if (marker_writer) {
        for (int q = 0; q < R0; ++q) {
          auto ok = store.read_named(shard_tensor_name(q, {l, kStateKinds[k], b}),
                                     std::as_writable_bytes(std::span<float>(piece)));
          if (!ok) return ok.error();
          if (!*ok) continue;
          for (size_t i = 0; i < sh0; ++i) full[q * sh0 + i] = piece[i];
          full[pad0] += 1;
        }
      }
      if (auto s = allreduce_sum_long(comm, full); !s) return s;
      if (full[pad0] != R0)
        return Status(Code::kNotFound,
                      fmt::format("--resume --reshard: {} of the {} old shards of layer {} are in the "
                                  "daemons this run uses",
                                  full[pad0], R0, l));
      std::vector<float>& out = mine[static_cast<size_t>(l) * 3 + k];
      out.assign(shard[l], 0.0f);
      for (size_t i = 0; i < shard[l]; ++i) {
        const size_t at = static_cast<size_t>(rank) * shard[l] + i;
        if (at < layer_n[l]) out[i] = static_cast<float>(full[at]);
      }
    }
  }
  if (auto s = comm.barrier(); !s) return s;  // every rank read before any shard is replaced

  // The new layout: invalidate the markers; drop the old shards that no rank of this run
  // replaces in this daemon (old ranks >= R, and old ranks now on another daemon).
  if (auto s = store.open(layout); !s) return s;
  if (marker_writer) {
    if (auto s = store.write_marker(CommitMarker{}); !s) return s;
    auto held = store.names();  // the old ranks' checkpoints exist only if they were offloaded
    if (!held) return held.error();
    for (int q = 0; q < R0; ++q) {
      if (q < R && (*domains)[static_cast<size_t>(q)] == domain_hash(store)) continue;
      for (int l = 0; l < NL; ++l) {
        for (ShardKind kind : kStateKinds)
          for (int bb = 0; bb < 2; ++bb)
            if (auto s = store.drop_named(shard_tensor_name(q, {l, kind, bb})); !s) return s;
        if (auto s = store.drop_named(shard_tensor_name(q, {l, ShardKind::kGrad, 0})); !s) return s;
        const std::string ckpt = shard_tensor_name(q, {l, ShardKind::kCkpt, 0});
        if (std::ranges::find(*held, ckpt) != held->end())
          if (auto s = store.drop_named(ckpt); !s) return s;
      }
    }
  }
  if (auto s = comm.barrier(); !s) return s;
  for (int l = 0; l < NL; ++l) {
    auto pv = store.acquire_many(
        std::vector<ShardRef>{{l, ShardKind::kParam, b}, {l, ShardKind::kM, b}, {l, ShardKind::kV, b}},
        Access::kOverwrite);
    if (!pv) return pv.error();
    for (int k = 0; k < 3; ++k)
      std::memcpy((*pv)[k].data, mine[static_cast<size_t>(l) * 3 + k].data(), shard[l] * sizeof(float));
    store.release_many(*pv);
    auto g = store.acquire({l, ShardKind::kGrad, 0}, Access::kOverwrite);
    if (!g) return g.error();
    std::memset(g->data, 0, shard[l] * sizeof(float));
  }
  if (auto s = comm.barrier(); !s) return s;
  if (marker_writer) {
    const CommitMarker now{CommitMarker::kMagic, static_cast<uint64_t>(newest), uint64_t(R), hash};
    if (auto s = store.write_marker(now); !s) return s;
  }
  start = newest + 1;
  return comm.barrier();
}

}  // namespace tier::train::detail
