// ThreadPoolBackend: pread/pwrite/fdatasync on worker threads, for filesystems that refuse O_DIRECT
// (tmpfs on older kernels) and kernels without io_uring. Same contract as every backend:
// raw results (short transfers and -EAGAIN are reported, not retried), an eventfd for the loop.
#include <errno.h>
#include <numa.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "base/log.hpp"
#include "nvme/io_backend.hpp"
#include "nvme/worker_pool.hpp"
#include "base/errors.hpp"

namespace tier::nvme {
namespace {

class ThreadPoolBackend final : public IoBackend {
 public:
  ThreadPoolBackend(int efd, const BackendOptions& o)
      : efd_(efd),
        qd_(std::max<uint32_t>(1, o.queue_depth)),
        pool_(std::max<uint32_t>(1, o.threads), efd, run, [node = o.numa_node] { bind(node); }) {}

  ~ThreadPoolBackend() override {
    pool_.stop();  // workers finish the queue before exiting: nothing in flight is dropped
    ::close(efd_);
  }

  std::string_view name() const noexcept override { return "pread"; }

  Result<int> add_file(int fd) override {
    fds_.push_back(fd);
    return static_cast<int>(fds_.size() - 1);
  }

  bool register_memory(std::span<const MemRegion>) override { return false; }

  void submit(const IoRequest& req) override {
    pool_.submit({req, fds_.at(static_cast<size_t>(req.file))});
    ++in_flight_;
  }

  void flush() override {}

  size_t reap(std::vector<IoCompletion>& out) override {
    uint64_t v;
    while (::read(efd_, &v, sizeof v) == sizeof v) {}
    size_t n = pool_.take(out);
    in_flight_ -= n;
    return n;
  }

  int event_fd() const noexcept override { return efd_; }
  size_t in_flight() const noexcept override { return in_flight_; }
  uint32_t queue_depth() const noexcept override { return qd_; }

 private:
  struct Job {
    IoRequest req{};
    int fd = -1;
  };

  static void bind(int node) {
    if (node >= 0 && numa_available() >= 0 && numa_run_on_node(node) != 0)
      log_debug("nvme: pread worker: cannot run on NUMA node {}: {}", node, strerror(errno));
  }

  // One blocking call on a worker thread; the job carries its descriptor.
  static IoCompletion run(Job& j) {
    ssize_t n;
    do {
      switch (j.req.op) {
        case IoOp::kRead: n = ::pread(j.fd, j.req.buf, j.req.len, static_cast<off_t>(j.req.offset)); break;
        case IoOp::kWrite: n = ::pwrite(j.fd, j.req.buf, j.req.len, static_cast<off_t>(j.req.offset)); break;
        case IoOp::kSync:
        default:
          n = ::fdatasync(j.fd);  // 0 or -1
          break;
      }
    } while (n < 0 && errno == EINTR);
    return IoCompletion{j.req.user_data, n < 0 ? -errno : static_cast<int32_t>(n)};
  }

  int efd_;
  uint32_t qd_;
  std::vector<int> fds_;                // driver thread only; jobs carry their descriptor
  size_t in_flight_ = 0;                // driver thread only
  WorkerPool<Job, IoCompletion> pool_;  // its workers write efd_ until stopped
};

}  // namespace

Result<std::unique_ptr<IoBackend>> make_thread_pool_backend(const BackendOptions& o) {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return fail(Status::from_errno(errno, "eventfd"));
  return std::unique_ptr<IoBackend>(new ThreadPoolBackend(efd, o));
}

}  // namespace tier::nvme
