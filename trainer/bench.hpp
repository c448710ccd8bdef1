// tier-train --bench-optimizer: the AdamW shard update (vectorized, multi-threaded) against a
// plain scalar single-threaded loop, side by side in one run.
#pragma once

#include <string>

namespace tier::train {

// Returns JSON lines {"name","bytes","value","unit","baseline","ratio", ...}.
std::string bench_optimizer(int threads, size_t floats = size_t{1} << 22, int reps = 7);

}  // namespace tier::train
