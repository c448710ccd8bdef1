#include "registry.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "cuda_status.hpp"
#include "base/errors.hpp"

namespace tier::gpu::registry {
namespace {

struct Entry {
  uint64_t size = 0;
  uint32_t refs = 0;
  bool owned = false;  // registered by us: unregister at zero refs
};

// Keyed by base address; entries never overlap.
struct Record {
  std::mutex mu;
  std::map<uintptr_t, Entry> pieces;
};

Record& record() {
  static Record* r = new Record;  // never destroyed: stagers may be torn down in static dtors
  return *r;
}

constexpr uint64_t kMinPiece = 64ull << 20;

// Caller holds the mutex. The piece containing p, or end().
std::map<uintptr_t, Entry>::iterator lookup(Record& r, uintptr_t p) {
  auto it = r.pieces.upper_bound(p);
  if (it == r.pieces.begin()) return r.pieces.end();
  --it;
  return p < it->first + it->second.size ? it : r.pieces.end();
}

// Registers [base, base+size) as new pieces (none of it is in the record). Caller holds mu.
Status register_span(Record& r, uintptr_t base, uint64_t size, uint64_t piece, unsigned flags,
                     std::vector<Piece>& acquired, uint64_t& newly, uint32_t& calls) {
  uint64_t off = 0;
  while (off < size) {
    const uint64_t n = std::min(piece, size - off);
    void* p = reinterpret_cast<void*>(base + off);
    cudaError_t err = cudaHostRegister(p, n, flags);
    if (err == cudaErrorHostMemoryAlreadyRegistered) {
      (void)cudaGetLastError();
      r.pieces[base + off] = Entry{n, 1, false};
    } else if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (n > kMinPiece && !is_no_device(err)) {
        // Split the refused piece and try the halves.
        TIER_TRY(register_span(r, base + off, n, std::max(kMinPiece, n / 2), flags, acquired, newly, calls));
        off += n;
        continue;
      }
      return from_cuda(
          err, (flags & cudaHostRegisterReadOnly) != 0 ? "cudaHostRegister (read-only)" : "cudaHostRegister");
    } else {
      r.pieces[base + off] = Entry{n, 1, true};
      newly += n;
      ++calls;
    }
    acquired.push_back(Piece{base + off, n});
    off += n;
  }
  return Status::ok();
}

}  // namespace

Status acquire(uintptr_t base, uint64_t size, uint64_t max_piece, bool read_only,
               std::vector<Piece>& acquired, uint64_t& newly_registered, uint32_t& registrations) {
  if (size == 0) return Status::ok();
  if (max_piece == 0) return Status(Code::kInvalidArgument, "register_chunk_bytes is 0");
  unsigned flags = cudaHostRegisterPortable;
  if (read_only) {
    // Without the flag, registering a PROT_READ mapping fails; with it, the device must say
    // it supports read-only registration.
    int dev = 0, ok = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterReadOnlySupported, dev) != cudaSuccess || !ok) {
      (void)cudaGetLastError();
      return Status(Code::kUnsupported, "cudaHostRegisterReadOnly is not supported by this device");
    }
    flags |= cudaHostRegisterReadOnly;
  }
  Record& r = record();
  std::lock_guard lock(r.mu);
  const uintptr_t end = base + size;
  uintptr_t pos = base;
  while (pos < end) {
    auto it = lookup(r, pos);
    if (it != r.pieces.end()) {
      // Already registered: take a reference on the whole piece.
      ++it->second.refs;
      acquired.push_back(Piece{it->first, it->second.size});
      pos = it->first + it->second.size;
      continue;
    }
    // Unregistered gap up to the next registered piece (or the end).
    auto next = r.pieces.upper_bound(pos);
    const uintptr_t gap_end = next == r.pieces.end() ? end : std::min<uintptr_t>(end, next->first);
    TIER_TRY(
        register_span(r, pos, gap_end - pos, max_piece, flags, acquired, newly_registered, registrations));
    pos = gap_end;
  }
  return Status::ok();
}

void release(const std::vector<Piece>& pieces) {
  Record& r = record();
  std::lock_guard lock(r.mu);
  for (const Piece& p : pieces) {
    auto it = r.pieces.find(p.base);
    if (it == r.pieces.end() || it->second.refs == 0) continue;
    if (--it->second.refs > 0) continue;
    if (it->second.owned) {
      (void)cudaHostUnregister(reinterpret_cast<void*>(it->first));
      (void)cudaGetLastError();
    }
    r.pieces.erase(it);
  }
}

std::optional<Piece> find(uintptr_t p) {
  Record& r = record();
  std::lock_guard lock(r.mu);
  auto it = lookup(r, p);
  if (it == r.pieces.end()) return std::nullopt;
  return Piece{it->first, it->second.size};
}

}  // namespace tier::gpu::registry
