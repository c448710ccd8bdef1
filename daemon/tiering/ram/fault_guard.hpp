// The SIGBUS guard of arena mappings: what keeps a tenant from killing tierd by truncating an
// arena.
//
// A tenant maps its pool's arena through an fd tierd passes with MapArena, opened read-write
// (a MAP_SHARED, PROT_WRITE mapping needs that), and ftruncate() through such an fd works
// whoever owns the object: no permission stops a tenant from shrinking its arena. Pages past the
// new end are then gone, and the next access to them through tierd's own mapping (a checksum,
// a snapshot copy, a write-back bounce copy, on any thread) would raise SIGBUS and kill tierd.
//
// The guard is a process-wide SIGBUS handler. For a fault inside a registered arena mapping
// whose object is now shorter than the size tierd gave it (`committed`), it grows the object
// back with ftruncate() (async-signal-safe) and returns: the faulting access is retried and
// reads zeros where the tenant's truncation destroyed its own bytes. The repair is counted per
// arena (repairs(); tierd reports it for the pool) and one line goes to stderr. Any other
// SIGBUS (outside every arena, or with the object at its full size: no huge page or tmpfs
// space left) goes to the previous handler or the default action, as without the guard.
//
// Thread-safety: every function may be called from any thread; the handler reads the slots
// lock-free. A slot must be removed before its mapping is unmapped.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tier::daemon::fault_guard {

// Installs the handler (idempotent).
void install();

// Registers [base, base + len) of the object `fd`, which must stay at least `committed` bytes
// long; `name` is used in the stderr line (truncated to fit). Returns the slot, or -1 when
// every slot is taken (the mapping is then unguarded; the caller logs it).
[[nodiscard]] int add(const std::byte* base, uint64_t len, int fd, uint64_t committed, const char* name);
// The object has grown (or been re-measured): faults below `committed` are repaired.
void set_committed(int slot, uint64_t committed);
// How many faults the guard repaired in this slot.
[[nodiscard]] uint64_t repairs(int slot);
void remove(int slot);

}  // namespace tier::daemon::fault_guard
