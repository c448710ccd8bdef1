// Ranks and collectives of tier-train: MPI across processes, run on one communication thread.
//
// Every collective is queued as an Op and started by the comm thread in queue order; since each
// rank queues the same sequence, the collectives match across ranks. The thread starts an op
// (which may first pin its source or destination shard, e.g. take a tierd lease), keeps up to
// any number of non-blocking MPI requests in flight, polls them with MPI_Test every few
// microseconds (so Open MPI makes progress while the main thread computes) and runs the op's
// finish step (release the pin) when it completes. The main thread waits on Handles.
//
// One process started without mpirun/srun is R = 1 and never initializes MPI: collectives
// degenerate to copies.
//
// Thread-safety: submit() and the Handle methods may be called from any thread; the op's
// start/finish callbacks run on the comm thread only.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tier/status.hpp"

namespace tier::train {

class Comm {
 public:
  // A non-blocking request, opaque here so callers need not include mpi.h.
  struct Request;
  struct Op {
    // Runs on the comm thread. Starts the collective (via the start_* helpers below, which
    // leave the request null when the op completed at once) or fails.
    std::function<Status(Request&)> start;
    // Runs on the comm thread after completion (also after a failed start).
    std::function<void()> finish;
  };
  class Handle {
   public:
    Handle() = default;
    // Blocks until the op completed; returns its status. A default Handle is done.
    Status wait();
    bool valid() const { return state_ != nullptr; }
    struct State;  // defined in comm.cpp

   private:
    friend class Comm;
    std::shared_ptr<State> state_;
  };

  // Initializes MPI when launched by mpirun/srun (environment says so) or when force_mpi.
  [[nodiscard]] static Result<std::unique_ptr<Comm>> create(int* argc, char*** argv, bool force_mpi = false);
  ~Comm();  // stops the thread and finalizes MPI

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool mpi() const { return mpi_; }

  Handle submit(Op op);

  // Collective helpers for Op::start (comm thread only). Counts are floats per rank.
  Status start_allgather(const float* send, float* recv, size_t count, Request& req);
  Status start_reduce_scatter(const float* send, float* recv, size_t count, Request& req);
  // The same in bf16 (--precision bf16; values are bf16 bits, trainer/bf16.hpp). The gather
  // moves bf16 shards: `count` per rank into recv [R * count].
  Status start_allgather_bf16(const uint16_t* send, uint16_t* recv, size_t count, Request& req);
  // A bf16 reduce-scatter is two halves, so its sum is accumulated in fp32 in a fixed order
  // whatever MPI's reduction algorithm: this all-to-all sends chunk r of send [R * count] to
  // rank r and receives every rank's chunk of this rank's part into chunks [R * count], in
  // rank order (the bytes of a ring reduce-scatter); then, once it completed,
  // sum_chunks_bf16(chunks, R, count, recv) (trainer/bf16.hpp) writes the rounded sum.
  Status start_alltoall_bf16(const uint16_t* send, uint16_t* chunks, size_t count, Request& req);
  // Blocking conveniences, queued like any op.
  Status allreduce_sum(double* values, int n);
  Status allreduce_max(double* values, int n);
  // Every rank's `value`, indexed by rank (MPI_Iallgather), queued like any op.
  [[nodiscard]] Result<std::vector<uint64_t>> allgather(uint64_t value);
  Status barrier();
  // `bytes` at `data` from rank `root` to every rank (MPI_Ibcast), queued like any op, so a
  // caller on another thread (e.g. NCCL's bootstrap, trainer/cuda/pipeline_pass.cpp) never
  // enters MPI itself. One rank: nothing to do.
  Status broadcast(void* data, size_t bytes, int root = 0);

 private:
  Comm() = default;
  void run();

  struct Pending;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool mpi_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Op, std::shared_ptr<Handle::State>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tier::train
