// Stand-in for bench_nvme.cpp (the NVMe tier's suite) while that file does not exist; the build
// compiles this instead so tier-bench links and `tier-bench nvme` says what is missing.
#include <cstdio>

#include "suites.hpp"

namespace tier::bench {

int run_nvme(const BenchOptions&) {
  std::fprintf(stderr, "tier-bench: nvme suite not built\n");
  return 1;
}

}  // namespace tier::bench
