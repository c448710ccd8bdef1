#include "trainer/cuda/nccl_comm.hpp"
#include "wire/errors.hpp"

// The C API only: without these, Open MPI's mpi.h drags in its C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <string>

namespace tier::train::cuda {
namespace {

Status from_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::ok();
  const Code c = r == ncclInvalidArgument || r == ncclInvalidUsage ? Code::kInvalidArgument
                 : r == ncclSystemError                            ? Code::kIo
                                                                   : Code::kInternal;
  return Status(c, std::string(what) + ": " + ncclGetErrorString(r));
}

Status mpi_bcast(void* data, size_t bytes) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return Status(Code::kUnavailable, "NCCL bootstrap needs MPI, which is not initialized");
  if (MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    return Status(Code::kInternal, "MPI_Bcast of the NCCL unique id failed");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<NcclComm>> NcclComm::create(int rank, int size, int device, const Broadcast& bcast) {
  if (size < 1 || rank < 0 || rank >= size)
    return fail(Code::kInvalidArgument,
                "bad NCCL rank " + std::to_string(rank) + " of " + std::to_string(size));
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return fail(Code::kUnsupported, "no CUDA device: NCCL needs one");
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(Code::kInvalidArgument, "cudaSetDevice(" + std::to_string(device) + ") failed");
  }
  ncclUniqueId id{};
  if (rank == 0) {
    Status s = from_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (!s) return fail(std::move(s));
  }
  if (size > 1) {
    Status s = bcast ? bcast(&id, sizeof id) : mpi_bcast(&id, sizeof id);
    if (!s) return fail(std::move(s));
  }
  std::unique_ptr<NcclComm> c(new NcclComm);
  c->rank_ = rank;
  c->size_ = size;
  c->device_ = device;
  Status s = from_nccl(ncclCommInitRank(&c->comm_, size, id, rank), "ncclCommInitRank");
  if (!s) return fail(std::move(s));
  return c;
}

NcclComm::~NcclComm() {
  if (comm_) (void)ncclCommDestroy(comm_);
}

Status NcclComm::all_gather(const float* send, float* recv, size_t count, cudaStream_t s) {
  return from_nccl(ncclAllGather(send, recv, count, ncclFloat32, comm_, s), "ncclAllGather");
}

Status NcclComm::reduce_scatter(const float* send, float* recv, size_t count, cudaStream_t s) {
  return from_nccl(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_, s), "ncclReduceScatter");
}

Status NcclComm::all_gather_bf16(const uint16_t* send, uint16_t* recv, size_t count, cudaStream_t s) {
  return from_nccl(ncclAllGather(send, recv, count, ncclBfloat16, comm_, s), "ncclAllGather bf16");
}

Status NcclComm::reduce_scatter_bf16(const uint16_t* send, uint16_t* recv, size_t count, cudaStream_t s) {
  return from_nccl(ncclReduceScatter(send, recv, count, ncclBfloat16, ncclSum, comm_, s),
                   "ncclReduceScatter bf16");
}

Status NcclComm::all_reduce(float* buf, size_t count, cudaStream_t s) {
  return from_nccl(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_, s), "ncclAllReduce");
}

}  // namespace tier::train::cuda
