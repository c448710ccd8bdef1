// Which OpenBLAS kernels the CPU backend's GEMMs run, and picking better ones than the library's
// fallback on CPUs newer than the library.
//
// A DYNAMIC_ARCH OpenBLAS chooses its kernel set from the CPU model when it is loaded. A model
// the library does not know (Debian 12 ships 0.3.21, which predates Sapphire and Emerald Rapids)
// gets the generic SSE3 "Prescott" set, although the CPU runs the AVX-512 ones: the trainer's
// GEMMs were 2.4x slower and its CPU step 2.2x slower on such a CPU (docs/benchmarks.md). The
// only override is the OPENBLAS_CORETYPE variable, read when the library loads, before main.
#pragma once

namespace tier::train {

// The kernel set OpenBLAS runs in this process (e.g. "SkylakeX", "Haswell", "Prescott").
const char* blas_kernels();

// The kernel set to force for this process, or null to keep the library's choice: when the
// library fell back to a generic pre-AVX2 set and the CPU (and OS) support AVX-512 F/BW/DQ/VL
// ("SkylakeX") or AVX2 with FMA ("Haswell"). Null when OPENBLAS_CORETYPE is set (the caller's
// choice is kept) or off x86-64.
const char* better_blas_kernels();

}  // namespace tier::train
