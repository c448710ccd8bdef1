// `tier-train --collectives nccl`: the LayerStream (trainer/layer_stream.hpp) that runs a pass's
// data movement through the layer pipeline (pipeline.hpp) on the CUDA backend's device.
//
//   parameters: pinned shard --H2D (stager, straight from the lease)--> slot --NCCL all-gather-->
//               layer; the backend's compute stream waits for the gather only.
//   gradients:  grad buffer (compute) --NCCL reduce-scatter--> shard --D2H--> pinned grad shard.
//
// --precision bf16: the shards are bf16, and so are the H2D, the all-gather (ncclBfloat16) and
// the reduce-scatter; the layer is widened to fp32 on the device after its gather, and the fp32
// gradient rounded to bf16 on the compute stream before its reduce-scatter.
//
// Ownership and lifetimes:
// - The stream owns its tier::gpu::Stager, bound at open() to the store's tierd client (its
//   arenas are registered with CUDA) or, for resident state, detached with every private range
//   of the store registered. So it must be destroyed before the store (and the backend whose
//   compute stream it orders against).
// - A parameter pin is kept until the copy out of it completed: the event recorded on the
//   pipeline's copy stream after the fetch is synchronized before the same ring position is
//   fetched into again (depth fetches later), or in finish().
// - A gradient pin is kept, with the D2H's Transfer, until that Transfer completed: pins whose
//   copy is done are released at the next push_grad, the rest in finish(), which also takes
//   each shard's sum of squares on the host once its bytes are there.
// - Layer 0's gradient lives in a buffer of the stream (it is open from the head's forward to
//   the embedding's backward, longer than the pipeline's gradient ring holds a slot) and is
//   copied on the compute stream into a pipeline gradient slot when pushed.
//
// The NCCL communicator (ranks > 1) is bootstrapped with its unique id broadcast as an Op on
// the trainer's MPI comm thread (Comm::broadcast): that thread stays the only one in MPI.
#pragma once

#include <memory>

#include "tier/status.hpp"
#include "trainer/backend.hpp"
#include "trainer/comm.hpp"
#include "trainer/layer_stream.hpp"

namespace tier::train::cuda {

// Collective over the job's ranks when comm.size() > 1 (every rank must call it). kInvalidArgument
// when `backend` is not the CUDA backend; kUnsupported "no CUDA device ..." without a device;
// NCCL's error when the communicator cannot be set up.
[[nodiscard]] Result<std::unique_ptr<LayerStream>> make_pipeline_stream(Backend& backend, Comm& comm);

}  // namespace tier::train::cuda
