// The CPU backend: fp32, OpenBLAS GEMMs, OpenMP loops over rows and heads. Device memory is
// host memory (host_accessible() is true). Not thread-safe: one caller thread at a time; the
// methods themselves use the OpenMP thread pool of the calling process.
#pragma once

#include <memory>

#include "trainer/backend.hpp"

namespace tier::train {

std::unique_ptr<Backend> make_cpu_backend();

// Sets the OpenMP and OpenBLAS thread counts of this process (n >= 1).
void set_cpu_threads(int n);

}  // namespace tier::train
