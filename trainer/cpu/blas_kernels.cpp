#include "trainer/cpu/blas_kernels.hpp"

#include <cblas.h>

#include <cstdlib>
#include <string_view>

namespace tier::train {

const char* blas_kernels() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

const char* better_blas_kernels() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  // OpenBLAS's x86-64 sets that use neither AVX2 nor AVX-512: the fallbacks of its dynamic
  // dispatch for a CPU it does not recognize.
  const std::string_view now = blas_kernels();
  bool generic = false;
  for (std::string_view g : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Barcelona",
                             "Opteron", "Opteron_SSE3"})
    generic = generic || now == g;
  if (!generic) return nullptr;
  // __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 register state.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

}  // namespace tier::train
