// libtier GPU staging: DMA a leased tensor straight between the daemon's arena and a GPU.
//
//   auto client = tier::Client::connect();
//   auto stager = tier::gpu::Stager::create(**client, {.device = 0});   // kUnsupported: no GPU
//   auto lease = (*client)->lease(tensor_id, tier::LeaseMode::kRead);
//   auto xfer = (*stager)->copy_to_device(*lease, dev_ptr, my_stream);  // enqueued, not done
//   cudaStreamWaitEvent(compute_stream, xfer->event());                 // or xfer->wait()
//
// What it does: every arena the Client maps is registered with CUDA (cudaHostRegister) once,
// so the arena itself is pinned memory and a lease's bytes are the source or target of
// cudaMemcpyAsync: no bounce buffer and no second pinned copy of the shard. Before registering
// a range the stager tells tierd (Client::pin_for_dma), which then never punches those pages
// out of the arena on eviction: the device keeps DMAing the arena's own pages after an evict
// and refetch. An arena the client maps read-only (a group reader) is registered with
// cudaHostRegisterReadOnly. A range that CUDA or tierd refuses is not registered, its copies
// take CUDA's pageable path, and stats() says so (registration_error, pageable_bytes). Copies are split
// into chunks of StagerOptions::chunk_bytes (and at registration boundaries) and enqueued on
// the caller's stream, or on the stager's own H2D / D2H stream when none is given; each
// copy records one event after its last chunk.
//
// Linking: this header and its library (CMake target tier::gpu) are separate from libtier, so a
// program that does not include this header does not link CUDA. The header does not include
// CUDA headers: streams and events are the CUDA runtime's own handle types, declared here by
// their struct tags (cudaStream_t is `CUstream_st*`, cudaEvent_t is `CUevent_st*`), so a caller
// that includes <cuda_runtime_api.h> passes its cudaStream_t / cudaEvent_t without casts.
//
// Without a usable device (no GPU, no driver) every entry point returns kUnsupported with a
// message that starts "no CUDA device"; nothing aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tier/client.hpp"
#include "tier/status.hpp"

// The CUDA runtime's opaque handle structs (see the comment above).
struct CUstream_st;
struct CUevent_st;

namespace tier::gpu {

using StreamHandle = CUstream_st*;  // == cudaStream_t; nullptr = the stager's own stream
using EventHandle = CUevent_st*;    // == cudaEvent_t

// Number of CUDA devices; kUnsupported "no CUDA device: ..." when there is none or no driver.
[[nodiscard]] Result<int> device_count();
// The NUMA node the device's PCIe slot is attached to (from sysfs), -1 when unknown.
[[nodiscard]] Result<int> device_numa_node(int device);

struct StagerOptions {
  int device = 0;                      // the GPU this stager copies to and from
  uint64_t chunk_bytes = 64ull << 20;  // one cudaMemcpyAsync moves at most this much
  // cudaHostRegister is asked for at most this much at once; a larger arena is registered in
  // several pieces (some drivers and IOMMU setups refuse very large single registrations).
  // A refused piece is retried in halves down to 64 MiB before the stager gives up on it.
  uint64_t register_chunk_bytes = 1ull << 40;
  // true (the default): nothing is registered up front; the first copy that touches part of
  // an arena registers the 2 MiB granules of it that the copy covers, so a rank pins only what
  // it copies (its leased ranges). false: create() registers every mapped arena whole (the
  // pool's RAM quota per arena: a one-time cost that grows with the tier, and it fails where
  // tierd has not grown the arena over its whole reservation yet, falling back to pageable).
  bool register_on_demand = true;
  // When a span is not inside registered memory (registration refused, or memory not from an
  // arena), copy it anyway as pageable memory (CUDA stages it; slower, counted in
  // Stats::pageable_bytes). false: such a copy fails with kInvalidArgument.
  bool allow_pageable = true;
};

// The events a stager's copies record, reused: a Transfer takes one and gives it back when
// destroyed, so a small copy does not pay cudaEventCreate/Destroy (stager.cpp).
struct EventPool;

// A copy in flight. Move-only; owns the event recorded after its last chunk (until destroyed,
// when the event goes back to its stager's pool). Destroying a Transfer does not wait for it:
// the copy completes on its stream regardless, but the caller must keep the lease (and the
// device buffer) alive until the event has completed.
class [[nodiscard]] Transfer {
 public:
  Transfer() = default;
  Transfer(Transfer&& o) noexcept;
  Transfer& operator=(Transfer&& o) noexcept;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer();

  // Completed when every chunk of the copy has completed. Valid while the Transfer lives.
  EventHandle event() const noexcept { return event_; }
  StreamHandle stream() const noexcept { return stream_; }
  uint64_t bytes() const noexcept { return bytes_; }
  // true: DMA straight from/to registered arena memory; false: went through pageable staging.
  bool direct() const noexcept { return direct_; }
  // Non-blocking: true once complete (errors count as complete; wait() reports them).
  bool done() const noexcept;
  // Blocks until complete; the copy's error, if any.
  [[nodiscard]] Status wait();

 private:
  friend class Stager;
  void drop_event() noexcept;
  std::shared_ptr<EventPool> pool_;  // where event_ goes back; null: destroyed instead
  EventHandle event_ = nullptr;
  StreamHandle stream_ = nullptr;
  uint64_t bytes_ = 0;
  bool direct_ = false;
  int device_ = 0;
};

// Thread-safety: all members may be called from several threads at once (registration is
// serialized inside). Lifetime: a Stager created for a Client must not outlive it; destroying
// the stager synchronizes its streams and unregisters what it registered.
class Stager {
 public:
  // Checks for the device first (kUnsupported "no CUDA device" without one), then creates the
  // stager's streams and registers the arenas the client maps now (unless register_on_demand).
  [[nodiscard]] static Result<std::unique_ptr<Stager>> create(Client& client, const StagerOptions& opts = {});
  // A stager without a client: only memory given to register_range() is copied directly.
  [[nodiscard]] static Result<std::unique_ptr<Stager>> create_detached(const StagerOptions& opts = {});
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Registers every arena of the client not yet registered (once per arena id). Called by
  // create() and again, on demand, when a copy names memory outside every registered range
  // (the client maps arenas lazily).
  [[nodiscard]] Status register_arenas();
  // Registers private host memory (e.g. a trainer's resident state) the same way. The range
  // must stay mapped until the stager is destroyed.
  [[nodiscard]] Status register_range(std::span<std::byte> range);
  // true when [p, p+n) lies in memory this stager (or another in this process) registered.
  bool is_registered(const void* p, uint64_t n) const;

  // Host → device. `src` must lie in a held lease's bytes (or registered memory); `dst` is
  // device memory of at least src.size() bytes on this stager's device.
  [[nodiscard]] Result<Transfer> copy_to_device(const Lease& src, void* dst, StreamHandle stream = nullptr);
  [[nodiscard]] Result<Transfer> copy_to_device(std::span<const std::byte> src, void* dst,
                                                StreamHandle stream = nullptr);
  // Device → host. `dst` must be a write lease.
  [[nodiscard]] Result<Transfer> copy_to_host(const void* src, const Lease& dst,
                                              StreamHandle stream = nullptr);
  [[nodiscard]] Result<Transfer> copy_to_host(const void* src, std::span<std::byte> dst,
                                              StreamHandle stream = nullptr);

  int device() const noexcept;
  StreamHandle h2d_stream() const noexcept;
  StreamHandle d2h_stream() const noexcept;

  struct Stats {
    uint64_t registered_bytes = 0;  // host memory this stager registered
    uint32_t registrations = 0;     // cudaHostRegister calls that succeeded
    uint64_t direct_bytes = 0;      // copied straight from/to registered memory
    uint64_t pageable_bytes = 0;    // copied through CUDA's pageable staging
    uint64_t chunks = 0;            // cudaMemcpyAsync calls
    // Copied from/to an arena on another NUMA node than the GPU's (crossing the socket link);
    // 0 when either node is unknown. Shards should be placed with Placement::near_gpu.
    uint64_t remote_node_bytes = 0;
    int32_t gpu_numa_node = -1;  // device_numa_node(device), -1 when unknown
    // The first registration that was refused, at create() or on demand later (by CUDA,
    // e.g. cudaHostRegisterReadOnly unsupported, or by tierd refusing the pin): its range is
    // copied through the pageable path (pageable_bytes). Empty when none was refused.
    std::string registration_error;
  };
  Stats stats() const;

 private:
  struct Impl;
  [[nodiscard]] static Result<std::unique_ptr<Impl>> make_impl(Client* client, const StagerOptions& opts);
  explicit Stager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tier::gpu
