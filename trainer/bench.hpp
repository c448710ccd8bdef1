// tier-train --bench-optimizer: the AdamW shard update (vectorized, multi-threaded) against a
// plain scalar single-threaded loop, side by side in one run. tier-train --bench-attention: the
// CPU flash attention against the materialized reference, side by side in one run.
#pragma once

#include <string>

namespace tier::train {

// Returns JSON lines {"name","bytes","value","unit","baseline","ratio", ...}.
std::string bench_optimizer(int threads, size_t floats = size_t{1} << 22, int reps = 7);

// Forward + backward of causal attention with GPT-2 124M's heads (NH 12, HS 64) at T = 256
// (B = 4) and T = 1024 (B = 1), flash and reference interleaved repetition by repetition, the
// best forward and the best backward of `reps` each. Returns one JSON line per T:
// {"name","T","B","flash_ms","reference_ms" (forward + backward),"ratio" (reference / flash),
//  "flash_fwd_ms","flash_bwd_ms","reference_fwd_ms","reference_bwd_ms","flash_bytes",
//  "reference_bytes" (attention state saved + backward scratch),"max_rel_diff","threads"}.
std::string bench_attention(int threads, int reps = 5);

}  // namespace tier::train
