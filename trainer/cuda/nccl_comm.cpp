#include "trainer/cuda/nccl_comm.hpp"
#include "wire/errors.hpp"

// The C API only: without these, Open MPI's mpi.h drags in its C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace tier::train::cuda {
namespace {

// NCCL is loaded with dlopen when the first communicator is created, not linked: a binary of
// this target (tier-train, even --backend cpu or one rank) then starts on a machine whose NCCL
// lives elsewhere (PyTorch's nvidia-nccl-cu* wheel) or nowhere. $TIER_NCCL_LIBRARY names the
// library to load; the default is the soname, found through LD_LIBRARY_PATH.
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  std::string error;  // why loading failed; empty once loaded
};

template <class F> bool resolve(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && error.empty()) error = std::string("NCCL library lacks ") + name;
  return fn != nullptr;
}

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("TIER_NCCL_LIBRARY");
    const char* name = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      api.error = std::string("cannot load NCCL (") + name + "): " + (why ? why : "unknown error") +
                  " (PyTorch's nvidia-nccl wheel has it: add its lib/ to LD_LIBRARY_PATH)";
      return;
    }
    std::string err;
    resolve(lib, "ncclGetUniqueId", api.get_unique_id, err);
    resolve(lib, "ncclCommInitRank", api.comm_init_rank, err);
    resolve(lib, "ncclCommDestroy", api.comm_destroy, err);
    resolve(lib, "ncclAllGather", api.all_gather, err);
    resolve(lib, "ncclReduceScatter", api.reduce_scatter, err);
    resolve(lib, "ncclAllReduce", api.all_reduce, err);
    resolve(lib, "ncclGetErrorString", api.error_string, err);
    api.error = err;  // the library stays loaded for the process's lifetime
  });
  return api;
}

Status from_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::ok();
  const Code c = r == ncclInvalidArgument || r == ncclInvalidUsage ? Code::kInvalidArgument
                 : r == ncclSystemError                            ? Code::kIo
                                                                   : Code::kInternal;
  return Status(c, std::string(what) + ": " + nccl().error_string(r));
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
  if (const NcclApi& api = nccl(); !api.error.empty()) return fail(Code::kUnavailable, api.error);
  ncclUniqueId id{};
  if (rank == 0) {
    Status s = from_nccl(nccl().get_unique_id(&id), "ncclGetUniqueId");
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
  Status s = from_nccl(nccl().comm_init_rank(&c->comm_, size, id, rank), "ncclCommInitRank");
  if (!s) return fail(std::move(s));
  return c;
}

NcclComm::~NcclComm() {
  if (comm_) (void)nccl().comm_destroy(comm_);
}

Status NcclComm::all_gather(const float* send, float* recv, size_t count, cudaStream_t s) {
  return from_nccl(nccl().all_gather(send, recv, count, ncclFloat32, comm_, s), "ncclAllGather");
}

Status NcclComm::reduce_scatter(const float* send, float* recv, size_t count, cudaStream_t s) {
  return from_nccl(nccl().reduce_scatter(send, recv, count, ncclFloat32, ncclSum, comm_, s),
                   "ncclReduceScatter");
}

Status NcclComm::all_gather_bf16(const uint16_t* send, uint16_t* recv, size_t count, cudaStream_t s) {
  return from_nccl(nccl().all_gather(send, recv, count, ncclBfloat16, comm_, s), "ncclAllGather bf16");
}

Status NcclComm::reduce_scatter_bf16(const uint16_t* send, uint16_t* recv, size_t count, cudaStream_t s) {
  return from_nccl(nccl().reduce_scatter(send, recv, count, ncclBfloat16, ncclSum, comm_, s),
                   "ncclReduceScatter bf16");
}

Status NcclComm::all_reduce(float* buf, size_t count, cudaStream_t s) {
  return from_nccl(nccl().all_reduce(buf, buf, count, ncclFloat32, ncclSum, comm_, s), "ncclAllReduce");
}

}  // namespace tier::train::cuda
