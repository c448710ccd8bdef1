// `tier-train --optimizer gpu`: AdamW on the GPU over the rank's host shards through
// LayerPipeline::adamw (H2D of p, m, v, g; the fused kernel; D2H of p, m, v), instead of the
// CPU AdamW over the tier (the default, `--optimizer cpu`, ZeRO-Offload style). With
// --precision bf16 (update_bf16) the gradient goes up as bf16 and is widened on the device, and
// the new bf16 working copy comes back with p, m, v (LayerPipeline::adamw_bf16).
//
// Double buffering: the pipeline updates in place, so when the outputs are other buffers than
// the inputs (--buffers 2) the old p, m, v are first copied into the outputs on the host (one
// extra pass over 12 bytes per parameter), then updated there.
//
// Copies go through a detached tier::gpu::Stager with allow_pageable: a lease's bytes are
// copied through CUDA's pageable staging unless the arena was registered by a stager of the
// same process (the layer pipeline's). Thread-safety: one thread.
#pragma once

#include <memory>
#include <string>

#include "trainer/backend.hpp"
#include "trainer/trainer.hpp"

namespace tier::train::cuda {

// nullptr and *error when the backend is not the CUDA backend or no device can be used.
std::unique_ptr<OffloadOptimizer> make_gpu_optimizer(Backend& backend, std::string* error);

}  // namespace tier::train::cuda
