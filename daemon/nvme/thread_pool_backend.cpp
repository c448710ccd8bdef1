// ThreadPoolBackend: pread/pwrite/fdatasync on worker threads, for filesystems that refuse O_DIRECT
// (tmpfs on older kernels) and kernels without io_uring. Same contract as every backend:
// raw results (short transfers and -EAGAIN are reported, not retried), an eventfd for the loop.
#include <errno.h>
#include <numa.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "nvme/io_backend.hpp"
#include "daemon/log.hpp"

namespace tier::nvme {
namespace {

class ThreadPoolBackend final : public IoBackend {
 public:
  ThreadPoolBackend(int efd, const BackendOptions& o)
      : efd_(efd), qd_(std::max<uint32_t>(1, o.queue_depth)) {
    uint32_t n = std::max<uint32_t>(1, o.threads);
    for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this, node = o.numa_node] { work(node); });
  }

  ~ThreadPoolBackend() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;  // workers finish the queue before exiting: nothing in flight is dropped
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    ::close(efd_);
  }

  std::string_view name() const noexcept override { return "pread"; }

  Result<int> add_file(int fd) override {
    fds_.push_back(fd);
    return static_cast<int>(fds_.size() - 1);
  }

  bool register_memory(std::span<const MemRegion>) override { return false; }

  void submit(const IoRequest& req) override {
    Job j{req, fds_.at(static_cast<size_t>(req.file))};
    {
      std::lock_guard lk(mu_);
      queue_.push_back(j);
    }
    cv_.notify_one();
    ++in_flight_;
  }

  void flush() override {}

  size_t reap(std::vector<IoCompletion>& out) override {
    uint64_t v;
    while (::read(efd_, &v, sizeof v) == sizeof v) {
    }
    std::lock_guard lk(done_mu_);
    size_t n = done_.size();
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
    in_flight_ -= n;
    return n;
  }

  int event_fd() const noexcept override { return efd_; }
  size_t in_flight() const noexcept override { return in_flight_; }
  uint32_t queue_depth() const noexcept override { return qd_; }

 private:
  struct Job {
    IoRequest req;
    int fd;
  };

  void work(int node) {
    if (node >= 0 && numa_available() >= 0 && numa_run_on_node(node) != 0)
      log_debug("nvme: pread worker: cannot run on NUMA node {}: {}", node, strerror(errno));
    for (;;) {
      Job j;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        j = queue_.front();
        queue_.pop_front();
      }
      ssize_t n;
      do {
        switch (j.req.op) {
          case IoOp::kRead:
            n = ::pread(j.fd, j.req.buf, j.req.len, static_cast<off_t>(j.req.offset));
            break;
          case IoOp::kWrite:
            n = ::pwrite(j.fd, j.req.buf, j.req.len, static_cast<off_t>(j.req.offset));
            break;
          case IoOp::kSync:
          default:
            n = ::fdatasync(j.fd);  // 0 or -1
            break;
        }
      } while (n < 0 && errno == EINTR);
      IoCompletion c{j.req.user_data, n < 0 ? -errno : static_cast<int32_t>(n)};
      {
        std::lock_guard lk(done_mu_);
        done_.push_back(c);
      }
      uint64_t one = 1;
      [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof one);
    }
  }

  int efd_;
  uint32_t qd_;
  std::vector<int> fds_;  // driver thread only; jobs carry their descriptor
  size_t in_flight_ = 0;  // driver thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool stop_ = false;      // guarded by mu_
  std::mutex done_mu_;
  std::vector<IoCompletion> done_;  // guarded by done_mu_
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> make_thread_pool_backend(const BackendOptions& o) {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return fail(Status::from_errno(errno, "eventfd"));
  return std::unique_ptr<IoBackend>(new ThreadPoolBackend(efd, o));
}

}  // namespace tier::nvme
