// Process-wide record of host memory registered with CUDA (cudaHostRegister is per process,
// so every Stager of the process shares one record). Pieces are reference-counted: the stager
// that registered a piece and any that found it registered hold a reference; the last one to
// let go unregisters it, and only when it was registered by the registry (memory another part
// of the program registered is used but never unregistered here).
//
// Thread-safety: all functions may be called from any thread; one mutex guards the record.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tier/status.hpp"

namespace tier::gpu::registry {

struct Piece {
  uintptr_t base = 0;
  uint64_t size = 0;
};

// Registers [base, base+size) in pieces of at most max_piece bytes, halving a refused piece
// down to 64 MiB. Pieces already registered (by the registry or by others) gain a reference.
// read_only: the memory is mapped without write access (a group reader's arena): registered
// with cudaHostRegisterReadOnly, which the device must support (else the call fails; the
// caller reports it, it never silently copies pageable).
// `acquired` receives every piece this call took a reference on (to be released later), even
// when the call fails part way; `newly_registered` the bytes actually registered now.
[[nodiscard]] Status acquire(uintptr_t base, uint64_t size, uint64_t max_piece, bool read_only,
                             std::vector<Piece>& acquired, uint64_t& newly_registered,
                             uint32_t& registrations);
// Drops one reference on each piece; unregisters a piece at zero when the registry owns it.
void release(const std::vector<Piece>& pieces);

// The registered piece containing address p, if any.
std::optional<Piece> find(uintptr_t p);

}  // namespace tier::gpu::registry
