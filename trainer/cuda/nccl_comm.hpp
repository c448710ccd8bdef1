// An NCCL communicator across the ranks of tier-train, bootstrapped through MPI: rank 0 makes
// the ncclUniqueId and broadcasts it (MPI_Bcast on MPI_COMM_WORLD, or the caller's broadcast
// function when MPI calls must go through the trainer's comm thread), then every rank joins.
//
// Host C++23 (uses tier::Status); the collectives take device pointers and a CUDA stream and
// only enqueue: completion is ordered by events on that stream.
//
// Thread-safety: one thread at a time per communicator (NCCL's own rule).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "tier/status.hpp"

struct ncclComm;

namespace tier::train::cuda {

class NcclComm {
 public:
  // Broadcasts `bytes` at `data` from rank 0 to every rank (collective).
  using Broadcast = std::function<Status(void* data, size_t bytes)>;

  // `device` is this rank's GPU. With size == 1 no broadcast happens. When `bcast` is empty,
  // MPI_Bcast on MPI_COMM_WORLD is used (MPI must be initialized, and no other thread may be
  // in MPI at the same time unless MPI runs in MPI_THREAD_MULTIPLE). NCCL is dlopened here,
  // on the first call ($TIER_NCCL_LIBRARY, default libnccl.so.2): kUnavailable, naming the
  // library, when it cannot be loaded; kUnsupported "no CUDA device" without a device.
  [[nodiscard]] static Result<std::unique_ptr<NcclComm>> create(int rank, int size, int device,
                                                                const Broadcast& bcast = {});
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // recv[r * count + i] = rank r's send[i] (ZeRO-3 layout: a layer is `size` equal shards).
  [[nodiscard]] Status all_gather(const float* send, float* recv, size_t count, cudaStream_t s);
  // recv[i] = sum over ranks of their send[rank * count + i].
  [[nodiscard]] Status reduce_scatter(const float* send, float* recv, size_t count, cudaStream_t s);
  // The same on bf16 values (uint16_t bits, trainer/bf16.hpp; ncclBfloat16), for --precision
  // bf16. NCCL sums bf16 in its own order and rounds to bf16 along the way (in a ring, once per
  // hop), so a bf16 reduce-scatter is not bit-identical to the host path's fp32 sum in rank
  // order (trainer/comm.hpp).
  [[nodiscard]] Status all_gather_bf16(const uint16_t* send, uint16_t* recv, size_t count, cudaStream_t s);
  [[nodiscard]] Status reduce_scatter_bf16(const uint16_t* send, uint16_t* recv, size_t count,
                                           cudaStream_t s);
  // In-place sum across ranks (small buffers: losses, norms).
  [[nodiscard]] Status all_reduce(float* buf, size_t count, cudaStream_t s);

 private:
  NcclComm() = default;
  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
};

}  // namespace tier::train::cuda
