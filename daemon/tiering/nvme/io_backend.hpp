// Block I/O backends of the NVMe tier: the raw layer under IoQueue.
//
// A backend issues single reads, writes and syncs on files it was given (add_file) and reports
// each one's raw result exactly once: bytes transferred (possibly fewer than asked: a short
// transfer; 0 for a completed sync) or -errno (including -EAGAIN). It does not split, retry or
// resubmit; IoQueue does that once for every backend, so the retry logic is shared and driven
// in tests by FaultBackend.
//
// Durability: a completed write is not yet durable. It may sit in the drive's volatile cache,
// and with O_DIRECT into preallocated (unwritten) extents the file system has not yet committed
// the unwritten -> written conversion, so after a power loss the range reads as zeros. A
// kSync request (fdatasync: io_uring IORING_OP_FSYNC with IORING_FSYNC_DATASYNC, or
// ::fdatasync) makes durable every write to its file that had completed when the sync was
// submitted; writes still in flight at that moment are not covered. Nothing orders a sync
// after writes submitted together with it: the caller submits a sync only after the
// completions of the writes it must cover.
//
// Threading: a backend is driven by one thread (the daemon's event loop or a test): submit,
// flush, reap, add_file and register_memory must not be called concurrently. Backends that use
// worker threads hide them. Completion notification: event_fd() is a pollable descriptor that
// becomes readable when reap() may return something; reap() itself consumes the readiness, so a
// level-triggered epoll does not spin.
//
// Implementations: UringBackend (io_uring, O_DIRECT files, registered buffers and files),
// ThreadPoolBackend (pread/pwrite/fdatasync workers; tmpfs or kernels without io_uring),
// FaultBackend (wraps another and injects errors, short transfers and delays; models the
// volatile write cache for power-loss tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/status.hpp"

namespace tier::nvme {

// kSync: fdatasync of the whole file (offset, buf and len are ignored; len must be 0).
enum class IoOp : uint8_t { kRead = 0, kWrite = 1, kSync = 2 };

// One raw operation: one pread's, pwrite's or fdatasync's worth.
struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;             // index returned by add_file()
  uint64_t offset = 0;       // byte offset in the file
  std::byte* buf = nullptr;  // must stay valid until the completion is reaped
  uint32_t len = 0;
  uint64_t user_data = 0;  // returned unchanged in the completion
};

struct IoCompletion {
  uint64_t user_data = 0;
  int32_t result = 0;  // >= 0: bytes transferred (0 for a sync that succeeded); < 0: -errno
};

// Memory that I/O buffers will come from (the RAM tier's arenas, bounce buffers).
struct MemRegion {
  std::byte* base = nullptr;
  size_t len = 0;
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  // "io_uring" or "pread" (the names tierctl status shows); wrappers say "fault(io_uring)".
  virtual std::string_view name() const noexcept = 0;
  // Makes `fd` addressable as IoRequest::file. The caller keeps ownership of fd and must keep it
  // open until the backend is destroyed.
  [[nodiscard]] virtual Result<int> add_file(int fd) = 0;
  // Best effort: lets the backend pre-register memory (io_uring fixed buffers). Any failure is
  // logged and I/O proceeds unregistered; returns whether registration is in effect. Must be
  // called with nothing in flight; replaces any previous registration (an empty span just
  // unregisters). Registered regions must stay mapped until replaced: I/O through a registered
  // buffer uses the pages pinned at registration, even if the address was unmapped and reused.
  virtual bool register_memory(std::span<const MemRegion> regions) = 0;
  // Queues one operation. Never fails for lack of a submission slot (a backend may block
  // briefly to make room); the caller keeps at most queue_depth() operations in flight.
  virtual void submit(const IoRequest& req) = 0;
  // Makes queued operations visible to the device (io_submit); cheap when nothing is queued.
  virtual void flush() = 0;
  // Appends every completion available now to `out`; never blocks. Returns how many.
  virtual size_t reap(std::vector<IoCompletion>& out) = 0;
  // Readable when reap() may return a completion. Owned by the backend.
  virtual int event_fd() const noexcept = 0;
  virtual size_t in_flight() const noexcept = 0;
  virtual uint32_t queue_depth() const noexcept = 0;
};

struct BackendOptions {
  uint32_t queue_depth = 32;  // operations in flight at most
  uint32_t threads = 4;       // ThreadPoolBackend workers
  int numa_node = -1;         // pin workers (or io_uring's io-wq) to this node; -1 = don't
};

// io_uring: fails with kUnsupported (and a message saying why) when io_uring cannot be set up.
[[nodiscard]] Result<std::unique_ptr<IoBackend>> make_uring_backend(const BackendOptions& o);
[[nodiscard]] Result<std::unique_ptr<IoBackend>> make_thread_pool_backend(const BackendOptions& o);

// Blocks until `fd` is readable or timeout_ms passes (-1: forever). Returns false on timeout.
bool wait_readable(int fd, int timeout_ms);

}  // namespace tier::nvme
