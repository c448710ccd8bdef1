// --dump DIR: what a run computes, written out so that an independent implementation (the
// PyTorch reference, tests/trainer/reference_test.py) can check it step by step.
//
// For each of the first `steps` steps s of a run, rank 0 writes
//   DIR/params.<s>.bin  the parameters step s computes with (its forward and backward), and
//   DIR/grads.<s>.bin   the gradient of step s: summed over the ranks, before clipping,
// each as float32 (host byte order): every layer's unpadded flat buffer (trainer/backend.hpp
// layouts) in layer order 0 (embed/head), 1..L (blocks). params.<first step>.bin is the model
// the run starts from. The shards are all-gathered through `comm`, so every rank must call
// dump_layers at the same point with the same arguments (a collective).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "tier/status.hpp"
#include "trainer/comm.hpp"
#include "trainer/state.hpp"

namespace tier::train {

// Writes `path` (rank 0) with the full buffers of shard kind `kind` (copy `buffer`) of every
// layer: layer l has `shard[l]` floats per rank, of which the first `layer_floats[l]` of the
// gathered whole are parameters (the rest is padding, not written).
[[nodiscard]] Status dump_layers(Comm& comm, ShardStore& store, ShardKind kind, int buffer,
                                 std::span<const size_t> shard, std::span<const size_t> layer_floats,
                                 const std::string& path);

}  // namespace tier::train
