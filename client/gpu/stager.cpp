// tier::gpu::Stager: registration of client arenas and chunked cudaMemcpyAsync from/to leases.
#include "tier/gpu.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_status.hpp"
#include "registry.hpp"
#include "base/errors.hpp"

namespace tier::gpu {

// ---- free functions ------------------------------------------------------------------------

Result<int> device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(from_cuda(err, "cudaGetDeviceCount"));
  }
  if (n <= 0) return fail(Code::kUnsupported, "no CUDA device: cudaGetDeviceCount found none");
  return n;
}

Result<int> device_numa_node(int device) {
  auto n = device_count();
  TIER_TRY(n);
  if (device < 0 || device >= *n)
    return fail(Code::kInvalidArgument, "no CUDA device with index " + std::to_string(device));
  char bus[32] = {};
  cudaError_t err = cudaDeviceGetPCIBusId(bus, sizeof bus, device);
  if (err != cudaSuccess) return fail(from_cuda(err, "cudaDeviceGetPCIBusId"));
  std::string id(bus);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // sysfs names the device with a 4-hex-digit domain; CUDA may print 8.
  if (auto colon = id.find(':'); colon != std::string::npos && colon > 4) id.erase(0, colon - 4);
  std::ifstream f("/sys/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (!(f >> node)) node = -1;
  return node;
}

// ---- EventPool -----------------------------------------------------------------------------

// Events of one stager's device, free for a copy to record. An event handed back may still be
// pending (its Transfer was destroyed before the copy completed): recording it again is
// allowed, and waits already enqueued on it keep the earlier record. Shared by the stager and
// its Transfers, so a Transfer may outlive the stager.
struct EventPool {
  std::mutex mu;
  std::vector<cudaEvent_t> free;
  ~EventPool() {
    for (cudaEvent_t e : free) (void)cudaEventDestroy(e);
  }
  // The current device must be the stager's.
  cudaError_t take(cudaEvent_t& e) {
    {
      std::lock_guard lock(mu);
      if (!free.empty()) {
        e = free.back();
        free.pop_back();
        return cudaSuccess;
      }
    }
    return cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard lock(mu);
    free.push_back(e);
  }
};

// ---- Transfer ------------------------------------------------------------------------------

void Transfer::drop_event() noexcept {
  if (event_ == nullptr) return;
  if (pool_) {
    try {
      pool_->give_back(event_);
    } catch (...) {  // no memory for the free list: let the event go instead
      (void)cudaEventDestroy(event_);
    }
  } else {
    (void)cudaEventDestroy(event_);
  }
  event_ = nullptr;
  pool_.reset();
}

Transfer::Transfer(Transfer&& o) noexcept { *this = std::move(o); }

Transfer& Transfer::operator=(Transfer&& o) noexcept {
  if (this == &o) return *this;
  drop_event();
  pool_ = std::move(o.pool_);
  event_ = std::exchange(o.event_, nullptr);
  stream_ = std::exchange(o.stream_, nullptr);
  bytes_ = std::exchange(o.bytes_, 0);
  direct_ = o.direct_;
  device_ = o.device_;
  return *this;
}

Transfer::~Transfer() {
  // Destroying (or re-recording) a recorded, pending event is allowed.
  drop_event();
}

bool Transfer::done() const noexcept {
  if (event_ == nullptr) return true;
  // cudaEventQuery's cudaErrorNotReady is not sticky, but it becomes the thread's last error,
  // which a launcher reading cudaGetLastError() afterwards would take for its own failure:
  // clear it here (a real error stays: cudaPeekAtLastError is checked first).
  const cudaError_t before = cudaPeekAtLastError();
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    if (before == cudaSuccess) (void)cudaGetLastError();
    return false;
  }
  return true;
}

Status Transfer::wait() {
  if (event_ == nullptr) return Status::ok();
  return from_cuda(cudaEventSynchronize(event_), "wait for copy");
}

// ---- Stager --------------------------------------------------------------------------------

struct Stager::Impl {
  Client* client = nullptr;
  StagerOptions opts;
  cudaStream_t h2d = nullptr;
  cudaStream_t d2h = nullptr;
  std::shared_ptr<EventPool> events = std::make_shared<EventPool>();

  mutable std::mutex mu;  // guards the fields below
  // Arenas this stager has registered, as (id, base, size): a remapped arena (same id, new
  // address) is registered again rather than taken for the old mapping.
  std::set<std::tuple<uint64_t, uintptr_t, uint64_t>> arenas;
  std::vector<registry::Piece> acquired;  // references to release on destruction
  // Arena ranges tierd was told are pinned (Client::pin_for_dma): unpinned after release.
  std::vector<std::span<const std::byte>> daemon_pins;
  std::vector<Client::ArenaMapping> mapped;  // the client's arenas as last seen (NUMA nodes)
  Stats stats;

  ~Impl() {
    if (h2d != nullptr || d2h != nullptr) {
      DeviceGuard g(opts.device);
      if (h2d) {
        (void)cudaStreamSynchronize(h2d);
        (void)cudaStreamDestroy(h2d);
      }
      if (d2h) {
        (void)cudaStreamSynchronize(d2h);
        (void)cudaStreamDestroy(d2h);
      }
    }
    registry::release(acquired);
    for (std::span<const std::byte> r : daemon_pins) (void)client->pin_for_dma(r, false);
  }

  // Caller holds mu. Registers private memory (no arena, nothing for tierd to keep).
  Status acquire_locked(uintptr_t base, uint64_t size, bool read_only = false) {
    uint64_t newly = 0;
    uint32_t calls = 0;
    Status s = registry::acquire(base, size, opts.register_chunk_bytes, read_only, acquired, newly, calls);
    stats.registered_bytes += newly;
    stats.registrations += calls;
    return s;
  }

  // Caller holds mu. Registers [base, base+size) of arena `a`: first tierd is told to keep
  // the range's pages (it punches evicted extents otherwise, and the device would then DMA
  // pages the arena no longer has), then the range is registered, read-only when the client
  // maps the arena read-only. A refusal of either leaves the range unregistered, so its copies
  // go through the pageable path, which always sees the arena's current pages. The pin stays
  // until the stager is destroyed (after its registrations are released), even when the
  // registration failed part way.
  Status acquire_arena_locked(const Client::ArenaMapping& a, uintptr_t base, uint64_t size) {
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the arena's address, kept as an integer for range math
    std::span<const std::byte> range(reinterpret_cast<const std::byte*>(base), size);
    if (Status p = client->pin_for_dma(range, true); !p.is_ok())
      return Status(p.code(), "tierd did not take the pin that keeps the registered pages in arena " +
                                  std::to_string(a.arena_id) + ": " + p.message());
    daemon_pins.push_back(range);
    return acquire_locked(base, size, a.read_only);
  }

  // Caller holds mu. Keeps the first registration failure for Stats::registration_error.
  void note_error(const Status& s) {
    if (!s.is_ok() && stats.registration_error.empty()) stats.registration_error = s.to_string();
  }

  Status register_arenas() {
    if (client == nullptr) return Status::ok();
    std::lock_guard lock(mu);
    mapped = client->mapped_arenas();
    Status first;
    for (const Client::ArenaMapping& a : mapped) {
      const auto key = std::make_tuple(a.arena_id, reinterpret_cast<uintptr_t>(a.base), a.size);
      if (arenas.contains(key) || a.base == nullptr || a.size == 0) continue;
      Status s = acquire_arena_locked(a, reinterpret_cast<uintptr_t>(a.base), a.size);
      if (s.is_ok()) {
        arenas.insert(key);
      } else if (first.is_ok()) {
        first = Status(s.code(), "register arena " + std::to_string(a.arena_id) + ": " + s.message());
      }
    }
    note_error(first);
    return first;
  }

  // On-demand mode: registers the 2 MiB granules (relative to the arena base) of the arena
  // holding [p, p+n) that the range covers, in pieces of at most register_chunk_bytes. kNotFound when no
  // mapped arena holds the whole range.
  Status register_pieces(uintptr_t p, uint64_t n) {
    std::vector<Client::ArenaMapping> arenas = client->mapped_arenas();
    {
      std::lock_guard lock(mu);
      mapped = arenas;
    }
    for (const Client::ArenaMapping& a : arenas) {
      const auto base = reinterpret_cast<uintptr_t>(a.base);
      if (a.base == nullptr || p < base || p + n > base + a.size) continue;
      // Only the 2 MiB granules the copy covers: tierd grows an arena's object in whole
      // granules as it places extents, so past them the mapping may have no pages to pin.
      constexpr uint64_t g = 2ull << 20;
      const uint64_t lo = (p - base) / g * g;
      const uint64_t hi = std::min<uint64_t>(a.size, (p + n - base + g - 1) / g * g);
      std::lock_guard lock(mu);
      // A pin of its own even where another stager registered the piece already: that one's
      // pin goes when it is destroyed, this one's registration reference may outlive it.
      Status s = acquire_arena_locked(a, base + lo, hi - lo);
      note_error(s);
      return s;
    }
    return Status(Code::kNotFound, "no mapped arena holds the copied range");
  }

  // One segment of a copy: host range and whether it lies in registered memory.
  struct Segment {
    uintptr_t host;
    uint64_t off, len;
    bool pinned;
  };

  // Splits [host, host+len) at registration boundaries. Caller does not hold mu.
  std::vector<Segment> segments(uintptr_t host, uint64_t len) const {
    std::vector<Segment> out;
    uint64_t off = 0;
    while (off < len) {
      const uintptr_t p = host + off;
      if (auto piece = registry::find(p)) {
        const uint64_t n = std::min<uint64_t>(len - off, piece->base + piece->size - p);
        out.push_back({p, off, n, true});
        off += n;
      } else {
        // Pageable up to the next registered byte; probe page by page is too slow for big
        // spans, so the pageable run extends to the end (registration is per arena, so a span
        // inside a lease is either all registered or not at all in practice).
        out.push_back({p, off, len - off, false});
        off = len;
      }
    }
    return out;
  }

  Result<Transfer> copy(uintptr_t host, uint64_t len, uintptr_t dev, bool to_device, cudaStream_t stream) {
    if (len == 0) return fail(Code::kInvalidArgument, "empty copy");
    if (dev == 0) return fail(Code::kInvalidArgument, "null device pointer");
    std::vector<Segment> segs = segments(host, len);
    bool all_pinned = std::ranges::all_of(segs, [](const Segment& s) { return s.pinned; });
    if (!all_pinned && client != nullptr) {
      // The client may have mapped a new arena since the last registration, or (on demand)
      // this part of an arena is not registered yet.
      if (opts.register_on_demand) (void)register_pieces(host, len);
      else (void)register_arenas();
      segs = segments(host, len);
      all_pinned = std::ranges::all_of(segs, [](const Segment& s) { return s.pinned; });
    }
    if (!all_pinned && !opts.allow_pageable)
      return fail(Code::kInvalidArgument,
                  "copy names host memory that is not registered with CUDA (allow_pageable off)");

    DeviceGuard g(opts.device);
    if (g.error() != cudaSuccess) return fail(from_cuda(g.error(), "cudaSetDevice"));
    cudaStream_t s = stream != nullptr ? stream : (to_device ? h2d : d2h);
    const uint64_t chunk = std::max<uint64_t>(opts.chunk_bytes, 1);
    uint64_t chunks = 0, direct = 0, pageable = 0;
    for (const Segment& seg : segs) {
      for (uint64_t o = 0; o < seg.len; o += chunk) {
        const uint64_t n = std::min(chunk, seg.len - o);
        // Addresses are integers here for the segment math; CUDA takes them back as pointers.
        void* h = reinterpret_cast<void*>(seg.host + o);       // NOLINT(performance-no-int-to-ptr)
        void* d = reinterpret_cast<void*>(dev + seg.off + o);  // NOLINT(performance-no-int-to-ptr)
        cudaError_t err = to_device ? cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s)
                                    : cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s);
        if (err != cudaSuccess) {
          (void)cudaGetLastError();
          return fail(from_cuda(err, to_device ? "cudaMemcpyAsync H2D" : "cudaMemcpyAsync D2H"));
        }
        ++chunks;
      }
      (seg.pinned ? direct : pageable) += seg.len;
    }
    Transfer t;
    cudaError_t err = events->take(t.event_);
    if (err != cudaSuccess) return fail(from_cuda(err, "cudaEventCreate"));
    t.pool_ = events;
    err = cudaEventRecord(t.event_, s);
    if (err != cudaSuccess) return fail(from_cuda(err, "cudaEventRecord"));
    t.stream_ = s;
    t.bytes_ = len;
    t.direct_ = all_pinned;
    t.device_ = opts.device;
    std::lock_guard lock(mu);
    if (stats.gpu_numa_node >= 0) {
      for (const Client::ArenaMapping& a : mapped) {
        const auto base = reinterpret_cast<uintptr_t>(a.base);
        if (host >= base && host < base + a.size) {
          if (a.numa_node >= 0 && a.numa_node != stats.gpu_numa_node) stats.remote_node_bytes += len;
          break;
        }
      }
    }
    stats.chunks += chunks;
    stats.direct_bytes += direct;
    stats.pageable_bytes += pageable;
    return t;
  }
};

Result<std::unique_ptr<Stager::Impl>> Stager::make_impl(Client* client, const StagerOptions& opts) {
  auto n = device_count();
  TIER_TRY(n);
  if (opts.device < 0 || opts.device >= *n)
    return fail(Code::kInvalidArgument, "no CUDA device with index " + std::to_string(opts.device) + " (" +
                                            std::to_string(*n) + " present)");
  if (opts.chunk_bytes == 0 || opts.register_chunk_bytes == 0)
    return fail(Code::kInvalidArgument, "chunk sizes must be > 0");
  auto impl = std::make_unique<Stager::Impl>();
  impl->client = client;
  impl->opts = opts;
  impl->stats.gpu_numa_node = device_numa_node(opts.device).value_or(-1);
  DeviceGuard g(opts.device);
  if (g.error() != cudaSuccess) return fail(from_cuda(g.error(), "cudaSetDevice"));
  cudaError_t err = cudaStreamCreateWithFlags(&impl->h2d, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&impl->d2h, cudaStreamNonBlocking);
  if (err != cudaSuccess) return fail(from_cuda(err, "cudaStreamCreate"));
  return impl;
}

Stager::Stager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stager::~Stager() = default;

Result<std::unique_ptr<Stager>> Stager::create(Client& client, const StagerOptions& opts) {
  auto impl = make_impl(&client, opts);
  TIER_TRY(impl);
  std::unique_ptr<Stager> st(new Stager(std::move(*impl)));
  if (opts.register_on_demand) return st;
  Status s = st->impl_->register_arenas();  // a failure is kept in stats().registration_error
  // Refused registrations (by CUDA or by tierd) only cost speed when pageable copies are
  // allowed; a missing device fails the stager.
  if (!s.is_ok() && (!opts.allow_pageable || s.message().find("no CUDA device") != std::string::npos))
    return fail(std::move(s));
  return st;
}

Result<std::unique_ptr<Stager>> Stager::create_detached(const StagerOptions& opts) {
  auto impl = make_impl(nullptr, opts);
  TIER_TRY(impl);
  return std::unique_ptr<Stager>(new Stager(std::move(*impl)));
}

Status Stager::register_arenas() { return impl_->register_arenas(); }

Status Stager::register_range(std::span<std::byte> range) {
  if (range.empty()) return Status(Code::kInvalidArgument, "empty range");
  std::lock_guard lock(impl_->mu);
  Status s = impl_->acquire_locked(reinterpret_cast<uintptr_t>(range.data()), range.size());
  impl_->note_error(s);
  return s;
}

bool Stager::is_registered(const void* p, uint64_t n) const {
  const auto segs = impl_->segments(reinterpret_cast<uintptr_t>(p), n);
  return !segs.empty() && std::ranges::all_of(segs, [](const auto& s) { return s.pinned; });
}

Result<Transfer> Stager::copy_to_device(const Lease& src, void* dst, StreamHandle stream) {
  if (!src.valid()) return fail(Code::kInvalidArgument, "copy_to_device: lease is not held");
  return copy_to_device(std::span<const std::byte>(src.bytes()), dst, stream);
}

Result<Transfer> Stager::copy_to_device(std::span<const std::byte> src, void* dst, StreamHandle stream) {
  return impl_->copy(reinterpret_cast<uintptr_t>(src.data()), src.size(), reinterpret_cast<uintptr_t>(dst),
                     true, stream);
}

Result<Transfer> Stager::copy_to_host(const void* src, const Lease& dst, StreamHandle stream) {
  if (!dst.valid()) return fail(Code::kInvalidArgument, "copy_to_host: lease is not held");
  if (!is_write(dst.mode())) return fail(Code::kInvalidArgument, "copy_to_host: target needs a write lease");
  return copy_to_host(src, dst.bytes(), stream);
}

Result<Transfer> Stager::copy_to_host(const void* src, std::span<std::byte> dst, StreamHandle stream) {
  return impl_->copy(reinterpret_cast<uintptr_t>(dst.data()), dst.size(), reinterpret_cast<uintptr_t>(src),
                     false, stream);
}

int Stager::device() const noexcept { return impl_->opts.device; }
StreamHandle Stager::h2d_stream() const noexcept { return impl_->h2d; }
StreamHandle Stager::d2h_stream() const noexcept { return impl_->d2h; }

Stager::Stats Stager::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace tier::gpu
