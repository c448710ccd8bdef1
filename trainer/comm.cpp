#include "trainer/comm.hpp"
#include "wire/errors.hpp"

#define OMPI_SKIP_MPICXX 1  // the C API only: no libmpi_cxx
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

namespace tier::train {

struct Comm::Request {
  MPI_Request req = MPI_REQUEST_NULL;
};

struct Comm::Handle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

Status Comm::Handle::wait() {
  if (!state_) return {};
  std::unique_lock lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->done; });
  return state_->status;
}

namespace {
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}
// A collective over one rank: its result is its input, copied to recv (unless it is there).
Status one_rank_result(void* recv, const void* send, size_t bytes) {
  if (recv != send) std::memmove(recv, send, bytes);
  return {};
}

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return {};
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return {Code::kInternal, fmt::format("{}: {}", what, std::string(msg, static_cast<size_t>(len)))};
}
}  // namespace

Result<std::unique_ptr<Comm>> Comm::create(int* argc, char*** argv, bool force_mpi) {
  std::unique_ptr<Comm> c(new Comm());
  if (force_mpi || launched_by_mpi()) {
    int provided = 0;
    if (int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided); rc != MPI_SUCCESS)
      return fail(mpi_status(rc, "MPI_Init_thread"));
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      return fail(Code::kUnsupported, "MPI does not provide MPI_THREAD_SERIALIZED");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    c->mpi_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &c->local_rank_);
    MPI_Comm_size(local, &c->local_size_);
    MPI_Comm_free(&local);
  }
  c->thread_ = std::thread([p = c.get()] { p->run(); });
  return c;
}

Comm::~Comm() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (mpi_) MPI_Finalize();
}

namespace {
void complete(const std::shared_ptr<Comm::Handle::State>& st, Status s) {
  {
    std::lock_guard lk(st->mu);
    st->status = std::move(s);
    st->done = true;
  }
  st->cv.notify_all();
}
}  // namespace

Comm::Handle Comm::submit(Op op) {
  Handle h;
  h.state_ = std::make_shared<Handle::State>();
  if (!mpi_) {
    // One rank: every collective is a local copy; run it here rather than wake the thread.
    Request req;
    Status s = op.start ? op.start(req) : Status{};
    if (op.finish) op.finish();
    complete(h.state_, std::move(s));
    return h;
  }
  {
    std::lock_guard lk(mu_);
    queue_.emplace_back(std::move(op), h.state_);
  }
  cv_.notify_one();
  return h;
}

void Comm::run() {
  struct InFlight {
    Op op;
    std::shared_ptr<Handle::State> state;
    Request req;
  };
  std::vector<std::unique_ptr<InFlight>> inflight;
  for (;;) {
    std::deque<std::pair<Op, std::shared_ptr<Handle::State>>> batch;
    {
      std::unique_lock lk(mu_);
      if (inflight.empty()) cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty() && inflight.empty()) return;
      batch.swap(queue_);
    }
    for (auto& [op, st] : batch) {
      auto f = std::make_unique<InFlight>();
      f->op = std::move(op);
      f->state = std::move(st);
      Status s = f->op.start ? f->op.start(f->req) : Status{};
      if (!s || f->req.req == MPI_REQUEST_NULL) {
        if (f->op.finish) f->op.finish();
        complete(f->state, std::move(s));
        continue;
      }
      inflight.push_back(std::move(f));
    }
    bool progressed = false;
    for (size_t i = 0; i < inflight.size();) {
      int flag = 0;
      const int rc = MPI_Test(&inflight[i]->req.req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || flag) {
        auto& f = inflight[i];
        if (f->op.finish) f->op.finish();
        complete(f->state, mpi_status(rc, "MPI collective"));
        inflight.erase(inflight.begin() + static_cast<long>(i));
        progressed = true;
        continue;
      }
      ++i;
    }
    if (!inflight.empty() && !progressed) {
      std::unique_lock lk(mu_);
      // Poll again soon, or at once when new work arrives.
      cv_.wait_for(lk, std::chrono::microseconds(20), [&] { return !queue_.empty(); });
    }
  }
}

Status Comm::start_allgather(const float* send, float* recv, size_t count, Request& req) {
  if (size_ == 1) return one_rank_result(recv, send, count * sizeof(float));
  return mpi_status(MPI_Iallgather(send, static_cast<int>(count), MPI_FLOAT, recv, static_cast<int>(count),
                                   MPI_FLOAT, MPI_COMM_WORLD, &req.req),
                    "MPI_Iallgather");
}

Status Comm::start_reduce_scatter(const float* send, float* recv, size_t count, Request& req) {
  if (size_ == 1) return one_rank_result(recv, send, count * sizeof(float));
  return mpi_status(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                              MPI_COMM_WORLD, &req.req),
                    "MPI_Ireduce_scatter_block");
}

Status Comm::start_allgather_bf16(const uint16_t* send, uint16_t* recv, size_t count, Request& req) {
  if (size_ == 1) return one_rank_result(recv, send, count * sizeof(uint16_t));
  return mpi_status(MPI_Iallgather(send, static_cast<int>(count), MPI_UINT16_T, recv, static_cast<int>(count),
                                   MPI_UINT16_T, MPI_COMM_WORLD, &req.req),
                    "MPI_Iallgather");
}

Status Comm::start_alltoall_bf16(const uint16_t* send, uint16_t* chunks, size_t count, Request& req) {
  if (size_ == 1) return one_rank_result(chunks, send, count * sizeof(uint16_t));
  return mpi_status(MPI_Ialltoall(send, static_cast<int>(count), MPI_UINT16_T, chunks,
                                  static_cast<int>(count), MPI_UINT16_T, MPI_COMM_WORLD, &req.req),
                    "MPI_Ialltoall");
}

namespace {
Status allreduce(Comm& c, double* values, int n, MPI_Op mop) {
  if (c.size() == 1) return {};
  Comm::Op op;
  op.start = [values, n, mop](Comm::Request& r) {
    return mpi_status(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, mop, MPI_COMM_WORLD, &r.req),
                      "MPI_Iallreduce");
  };
  return c.submit(std::move(op)).wait();
}
}  // namespace

Status Comm::allreduce_sum(double* values, int n) { return allreduce(*this, values, n, MPI_SUM); }
Status Comm::allreduce_max(double* values, int n) { return allreduce(*this, values, n, MPI_MAX); }

Result<std::vector<uint64_t>> Comm::allgather(uint64_t value) {
  std::vector<uint64_t> all(static_cast<size_t>(size_), value);
  if (size_ == 1) return all;
  Op op;
  op.start = [&value, &all](Request& r) {
    return mpi_status(
        MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD, &r.req),
        "MPI_Iallgather");
  };
  if (auto s = submit(std::move(op)).wait(); !s) return fail(s);
  return all;
}

Status Comm::broadcast(void* data, size_t bytes, int root) {
  if (size_ == 1) return {};
  if (bytes > static_cast<size_t>(INT32_MAX))
    return {Code::kInvalidArgument, "broadcast: more than 2^31 bytes at once"};
  Op op;
  op.start = [data, bytes, root](Request& r) {
    return mpi_status(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &r.req),
                      "MPI_Ibcast");
  };
  return submit(std::move(op)).wait();
}

Status Comm::barrier() {
  if (size_ == 1) return {};
  Op op;
  op.start = [](Request& r) { return mpi_status(MPI_Ibarrier(MPI_COMM_WORLD, &r.req), "MPI_Ibarrier"); };
  return submit(std::move(op)).wait();
}

}  // namespace tier::train
