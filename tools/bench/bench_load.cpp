// tier-bench load: many clients hammering one tierd (issue 7). Not written yet; the suite
// exists so `tier-bench load` and `all` fail clearly instead of silently skipping it.
#include <cstdio>

#include "suites.hpp"

namespace tier::bench {

int run_load(const BenchOptions&) {
  std::fprintf(stderr, "tier-bench: the load suite is not built yet\n");
  return 1;
}

}  // namespace tier::bench
