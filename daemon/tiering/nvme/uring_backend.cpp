// UringBackend: io_uring with registered files and buffers and an eventfd for the event loop.
// Syncs are IORING_OP_FSYNC with IORING_FSYNC_DATASYNC.
#include <errno.h>
#include <liburing.h>
#include <numa.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "nvme/io_backend.hpp"
#include "base/log.hpp"
#include "base/errors.hpp"

namespace tier::nvme {
namespace {

// The kernel refuses a single registered buffer larger than 1 GiB; larger regions are
// registered as several consecutive buffers.
constexpr size_t kMaxRegisteredBuffer = size_t{1} << 30;
// Slots in the sparse registered-file table; files beyond it use plain descriptors.
constexpr unsigned kRegisteredFileSlots = 4096;

void drain_eventfd(int fd) {
  uint64_t v;
  while (::read(fd, &v, sizeof v) == sizeof v) {}
}

class UringBackend final : public IoBackend {
 public:
  UringBackend(io_uring ring, int efd, uint32_t qd) : ring_(ring), efd_(efd), qd_(qd) {
    int rc = io_uring_register_files_sparse(&ring_, kRegisteredFileSlots);
    files_registered_ = rc == 0;
    if (!files_registered_)
      log_debug("nvme: io_uring: registered files unavailable ({}), using plain descriptors", strerror(-rc));
  }

  ~UringBackend() override {
    // The kernel may still write into caller buffers until every request completes.
    flush();
    while (in_kernel_ > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_kernel_;
    }
    io_uring_queue_exit(&ring_);
    ::close(efd_);
  }

  std::string_view name() const noexcept override { return "io_uring"; }

  Result<int> add_file(int fd) override {
    int index = static_cast<int>(fds_.size());
    fds_.push_back(fd);
    fixed_.push_back(false);
    if (files_registered_ && static_cast<unsigned>(index) < kRegisteredFileSlots) {
      int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(index), &fd, 1);
      if (rc == 1) fixed_.back() = true;
      else
        log_debug("nvme: io_uring: registering file {} failed ({}), using its descriptor", index,
                  strerror(rc < 0 ? -rc : EINVAL));
    }
    return index;
  }

  bool register_memory(std::span<const MemRegion> regions) override {
    if (!regions_.empty()) {
      io_uring_unregister_buffers(&ring_);
      regions_.clear();
      order_.clear();
    }
    std::vector<MemRegion> split;
    for (const MemRegion& r : regions) {
      for (size_t off = 0; off < r.len; off += kMaxRegisteredBuffer)
        split.push_back({r.base + off, std::min(kMaxRegisteredBuffer, r.len - off)});
    }
    if (split.empty()) return false;
    std::vector<iovec> iov;
    for (const MemRegion& r : split) iov.push_back({r.base, r.len});
    int rc = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (rc < 0) {
      log_warn(
          "nvme: io_uring: registering {} buffer(s) as fixed buffers failed ({}{}); "
          "I/O proceeds with unregistered buffers",
          iov.size(), strerror(-rc), rc == -ENOMEM ? ": RLIMIT_MEMLOCK too low? raise LimitMEMLOCK" : "");
      return false;
    }
    regions_ = std::move(split);
    order_.resize(regions_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(),
              [&](size_t a, size_t b) { return regions_[a].base < regions_[b].base; });
    return true;
  }

  void submit(const IoRequest& req) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      // The submission ring is full: hand it to the kernel, and if that does not free a slot
      // (the kernel pushes back while completions are unreaped), reap one into the stash.
      int rc = io_uring_submit(&ring_);
      if (rc > 0) in_kernel_ += static_cast<size_t>(rc), queued_ -= static_cast<size_t>(rc);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe != nullptr) break;
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) == 0) {
        stash_.push_back({cqe->user_data, cqe->res});
        io_uring_cqe_seen(&ring_, cqe);
        --in_kernel_;
      }
      sqe = io_uring_get_sqe(&ring_);
    }
    int fd = fds_.at(static_cast<size_t>(req.file));
    bool fixed_file = fixed_[static_cast<size_t>(req.file)];
    int target = fixed_file ? req.file : fd;
    int buf_index = req.op == IoOp::kSync ? -1 : find_region(req.buf, req.len);
    if (req.op == IoOp::kSync) {
      // fdatasync: commits the file system metadata the data needs (O_DIRECT into fallocated,
      // unwritten extents converts them to written) and flushes the drive's volatile cache.
      io_uring_prep_fsync(sqe, target, IORING_FSYNC_DATASYNC);
    } else if (req.op == IoOp::kRead) {
      if (buf_index >= 0) io_uring_prep_read_fixed(sqe, target, req.buf, req.len, req.offset, buf_index);
      else io_uring_prep_read(sqe, target, req.buf, req.len, req.offset);
    } else {
      if (buf_index >= 0) io_uring_prep_write_fixed(sqe, target, req.buf, req.len, req.offset, buf_index);
      else io_uring_prep_write(sqe, target, req.buf, req.len, req.offset);
    }
    if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, req.user_data);
    ++queued_;
    ++in_flight_;
  }

  void flush() override {
    while (queued_ > 0) {
      int rc = io_uring_submit(&ring_);
      if (rc > 0) {
        in_kernel_ += static_cast<size_t>(rc);
        queued_ -= static_cast<size_t>(rc);
        continue;
      }
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN || rc == -EBUSY) {
        // Kernel back-pressure: completions must be consumed first; reap() retries the flush.
        stash_cqes();
        if (in_kernel_ > 0) continue;
      }
      if (rc < 0) log_error("nvme: io_uring_submit failed: {}", strerror(-rc));
      return;
    }
  }

  size_t reap(std::vector<IoCompletion>& out) override {
    // Consume the eventfd first: a completion posted after this read bumps it again.
    drain_eventfd(efd_);
    size_t n = stash_.size();
    out.insert(out.end(), stash_.begin(), stash_.end());
    stash_.clear();
    for (;;) {
      n += take_cqes(out);
      // Completions that did not fit the CQ ring wait in the kernel's overflow list; they
      // reach the ring only through io_uring_enter, which peeking never calls.
      if (!io_uring_cq_has_overflow(&ring_)) break;
      io_uring_get_events(&ring_);
    }
    in_flight_ -= n;
    if (queued_ > 0) flush();
    return n;
  }

  int event_fd() const noexcept override { return efd_; }
  size_t in_flight() const noexcept override { return in_flight_; }
  uint32_t queue_depth() const noexcept override { return qd_; }

 private:
  size_t take_cqes(std::vector<IoCompletion>& out) {
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      out.push_back({cqe->user_data, cqe->res});
      ++seen;
    }
    io_uring_cq_advance(&ring_, seen);
    in_kernel_ -= seen;
    return seen;
  }

  void stash_cqes() {
    take_cqes(stash_);
    if (io_uring_cq_has_overflow(&ring_)) {
      io_uring_get_events(&ring_);
      take_cqes(stash_);
    }
  }

  int find_region(const std::byte* buf, size_t len) const {
    // order_ sorts region indexes by base address; the candidate is the last base <= buf.
    auto it = std::upper_bound(order_.begin(), order_.end(), buf,
                               [&](const std::byte* b, size_t i) { return b < regions_[i].base; });
    if (it == order_.begin()) return -1;
    const MemRegion& r = regions_[*(it - 1)];
    if (buf + len <= r.base + r.len) return static_cast<int>(*(it - 1));
    return -1;
  }

  io_uring ring_;
  int efd_;
  uint32_t qd_;
  bool files_registered_ = false;
  std::vector<int> fds_;
  std::vector<bool> fixed_;
  std::vector<MemRegion> regions_;   // registered buffer i = regions_[i]
  std::vector<size_t> order_;        // indexes of regions_ sorted by base
  std::vector<IoCompletion> stash_;  // reaped from the ring while making room, not yet returned
  size_t queued_ = 0;                // prepared SQEs not yet submitted
  size_t in_kernel_ = 0;             // submitted, completion not yet taken off the ring
  size_t in_flight_ = 0;             // submit() calls whose completion reap() has not returned
};

}  // namespace

Result<std::unique_ptr<IoBackend>> make_uring_backend(const BackendOptions& o) {
  uint32_t qd = std::max<uint32_t>(1, o.queue_depth);
  io_uring ring;
  int rc = io_uring_queue_init(qd, &ring, 0);
  if (rc < 0)
    return fail(Code::kUnsupported,
                fmt::format("io_uring unavailable: io_uring_queue_init: {}", strerror(-rc)));
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) {
    int err = errno;
    io_uring_queue_exit(&ring);
    return fail(Status::from_errno(err, "eventfd"));
  }
  rc = io_uring_register_eventfd(&ring, efd);
  if (rc < 0) {
    io_uring_queue_exit(&ring);
    ::close(efd);
    return fail(Code::kUnsupported,
                fmt::format("io_uring unavailable: io_uring_register_eventfd: {}", strerror(-rc)));
  }
  if (o.numa_node >= 0 && numa_available() >= 0) {
    // io-wq workers (used when a request cannot be issued inline) run near the device.
    bitmask* cpus = numa_allocate_cpumask();
    if (numa_node_to_cpus(o.numa_node, cpus) == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (unsigned c = 0; c < cpus->size && c < CPU_SETSIZE; ++c)
        if (numa_bitmask_isbitset(cpus, c)) CPU_SET(c, &set);
      int arc = io_uring_register_iowq_aff(&ring, sizeof set, &set);
      if (arc < 0)
        log_debug("nvme: io_uring: io-wq affinity to node {} not set: {}", o.numa_node, strerror(-arc));
    }
    numa_free_cpumask(cpus);
  }
  return std::unique_ptr<IoBackend>(new UringBackend(ring, efd, qd));
}

bool wait_readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int rc = ::poll(&p, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

}  // namespace tier::nvme
