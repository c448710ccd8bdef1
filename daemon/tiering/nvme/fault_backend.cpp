#include "nvme/fault_backend.hpp"
#include "base/errors.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace tier::nvme {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kHoldMs = UINT32_MAX;  // in delayed_: held until release_held()

class FaultBackendImpl final : public FaultBackend {
 public:
  FaultBackendImpl(std::unique_ptr<IoBackend> inner, std::vector<FaultRule> rules, uint64_t seed, int epfd,
                   int efd, int tfd)
      : inner_(std::move(inner)), rng_(seed), epfd_(epfd), efd_(efd), tfd_(tfd) {
    name_ = "fault(" + std::string(inner_->name()) + ")";
    set_rules(std::move(rules));
  }
  ~FaultBackendImpl() override {
    // Delayed completions are only held in user space; the inner backend drains its own I/O.
    inner_.reset();
    ::close(epfd_);
    ::close(efd_);
    ::close(tfd_);
  }

  void set_rules(std::vector<FaultRule> rules) override {
    rules_ = std::move(rules);
    seen_.assign(rules_.size(), 0);
    fires_.assign(rules_.size(), 0);
  }
  uint64_t fired(FaultKind k) const noexcept override { return fired_[static_cast<size_t>(k)]; }
  size_t holding() const noexcept override {
    return static_cast<size_t>(std::count_if(
        held_.begin(), held_.end(), [](const Held& h) { return h.due == Clock::time_point::max(); }));
  }
  void release_held() override {
    for (Held& h : held_)
      if (h.due == Clock::time_point::max()) h.due = Clock::time_point::min();
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof one);
  }
  void set_observer(Observer o) override { observer_ = std::move(o); }

  uint64_t volatile_bytes() const noexcept override {
    uint64_t n = 0;
    for (const auto& [ud, w] : issued_) n += w.len;
    for (const auto& [file, ws] : volatile_)
      for (const Written& w : ws) n += w.len;
    return n;
  }
  Result<uint64_t> power_loss() override;
  bool powered_off() const noexcept override { return off_; }

  std::string_view name() const noexcept override { return name_; }
  Result<int> add_file(int fd) override {
    auto idx = inner_->add_file(fd);
    if (idx) fds_[*idx] = fd;
    return idx;
  }
  bool register_memory(std::span<const MemRegion> r) override { return inner_->register_memory(r); }

  void submit(const IoRequest& req) override {
    ++in_flight_;  // every submit completes once: synthesized, held or from the inner backend
    if (off_) {
      synthesize(req, -EIO);
      return;
    }
    const FaultRule* hit = nullptr;
    for (size_t i = 0; i < rules_.size() && hit == nullptr; ++i) {
      const FaultRule& r = rules_[i];
      if (r.op && *r.op != req.op) continue;
      if (fires_[i] >= r.max_fires) continue;
      uint64_t n = ++seen_[i];
      bool fire =
          r.nth != 0 ? n == r.nth : std::uniform_real_distribution<double>(0, 1)(rng_) < r.probability;
      if (fire) {
        ++fires_[i];
        hit = &r;
      }
    }
    FaultKind kind = hit ? hit->kind : FaultKind::kDelay;
    if (hit && kind == FaultKind::kShort && req.len <= 4096) kind = FaultKind::kEagain;
    if (hit) ++fired_[static_cast<size_t>(kind)];
    if (hit == nullptr) {
      issue(req);
      return;
    }
    switch (kind) {
      case FaultKind::kEio: synthesize(req, -EIO); return;
      case FaultKind::kEnospc: synthesize(req, -ENOSPC); return;
      case FaultKind::kEagain: synthesize(req, -EAGAIN); return;
      case FaultKind::kShort: {
        IoRequest shorter = req;
        shorter.len = std::max<uint32_t>(4096, (req.len / 2) & ~uint32_t{4095});
        issue(shorter);
        return;
      }
      case FaultKind::kDelay:
        delayed_[req.user_data] = hit->delay_ms;
        issue(req);
        return;
      case FaultKind::kHold:
        delayed_[req.user_data] = kHoldMs;
        issue(req);
        return;
    }
  }

  void flush() override { inner_->flush(); }

  size_t reap(std::vector<IoCompletion>& out) override {
    uint64_t v;
    while (::read(efd_, &v, sizeof v) == sizeof v) {}
    while (::read(tfd_, &v, sizeof v) == sizeof v) {}
    size_t before = out.size();
    out.insert(out.end(), synthetic_.begin(), synthetic_.end());
    synthetic_.clear();
    if (off_) {  // the device is off: what was held back or drained fails, now
      for (const Held& h : held_) out.push_back(h.c);
      held_.clear();
      for (size_t i = before; i < out.size(); ++i) out[i].result = -EIO;
      size_t n = out.size() - before;
      in_flight_ -= n;
      return n;
    }
    scratch_.clear();
    inner_->reap(scratch_);
    auto now = Clock::now();
    for (const IoCompletion& c : scratch_) {
      auto it = delayed_.find(c.user_data);
      if (it == delayed_.end()) {
        out.push_back(c);
        continue;
      }
      held_.push_back({c, it->second == kHoldMs ? Clock::time_point::max()
                                                : now + std::chrono::milliseconds(it->second)});
      delayed_.erase(it);
    }
    Clock::time_point next = Clock::time_point::max();
    for (size_t i = 0; i < held_.size();) {
      if (held_[i].due <= now) {
        out.push_back(held_[i].c);
        held_[i] = held_.back();
        held_.pop_back();
      } else {
        if (held_[i].due != Clock::time_point::max()) next = std::min(next, held_[i].due);
        ++i;
      }
    }
    if (next != Clock::time_point::max()) arm(next - now);
    for (size_t i = before; i < out.size(); ++i) reported(out[i]);
    size_t n = out.size() - before;
    in_flight_ -= n;
    return n;
  }

  int event_fd() const noexcept override { return epfd_; }
  size_t in_flight() const noexcept override { return in_flight_; }
  uint32_t queue_depth() const noexcept override { return inner_->queue_depth(); }

 private:
  struct Held {
    IoCompletion c;
    Clock::time_point due;
  };
  // A write issued to the inner backend; `seq` orders its report among all reports.
  struct Written {
    int file = -1;
    uint64_t offset = 0, len = 0, seq = 0;
  };
  // A sync issued to the inner backend: it covers the file's writes reported up to `seq`.
  struct Sync {
    int file = -1;
    uint64_t seq = 0;
  };

  // Hands `req` to the inner backend, tracking what it may write or make durable.
  void issue(const IoRequest& req) {
    if (req.op == IoOp::kWrite) issued_[req.user_data] = {req.file, req.offset, req.len, 0};
    else if (req.op == IoOp::kSync) syncs_[req.user_data] = {req.file, reported_seq_};
    inner_->submit(req);
  }

  // `c` is being reported to the caller: a write becomes volatile (ordered by its report), a
  // sync that succeeded makes the writes it covers durable. Whatever the write's result, its
  // range may have been touched, so it stays volatile until a sync covers it.
  void reported(const IoCompletion& c) {
    if (auto it = issued_.find(c.user_data); it != issued_.end()) {
      Written w = it->second;
      issued_.erase(it);
      w.seq = ++reported_seq_;
      volatile_[w.file].push_back(w);
      if (observer_) observer_(IoOp::kWrite, c);
    } else if (auto st = syncs_.find(c.user_data); st != syncs_.end()) {
      Sync y = st->second;
      syncs_.erase(st);
      ++reported_seq_;
      if (c.result >= 0) std::erase_if(volatile_[y.file], [&](const Written& w) { return w.seq <= y.seq; });
      if (observer_) observer_(IoOp::kSync, c);
    }
  }

  void synthesize(const IoRequest& req, int32_t res) {
    synthetic_.push_back({req.user_data, res});
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof one);
  }

  void arm(Clock::duration d) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    if (ns <= 0) ns = 1;
    itimerspec its{};
    its.it_value.tv_sec = ns / 1000000000;
    its.it_value.tv_nsec = ns % 1000000000;
    timerfd_settime(tfd_, 0, &its, nullptr);
  }

  std::unique_ptr<IoBackend> inner_;
  std::string name_;
  std::vector<FaultRule> rules_;
  std::vector<uint64_t> seen_, fires_;
  std::array<uint64_t, kFaultKinds> fired_{};
  std::mt19937_64 rng_;
  int epfd_, efd_, tfd_;
  std::vector<IoCompletion> synthetic_, scratch_;
  std::unordered_map<uint64_t, uint32_t> delayed_;  // user_data -> delay, issued to inner
  std::vector<Held> held_;
  size_t in_flight_ = 0;
  std::unordered_map<int, int> fds_;                        // file index -> descriptor
  std::unordered_map<uint64_t, Written> issued_;            // user_data -> write not yet reported
  std::unordered_map<uint64_t, Sync> syncs_;                // user_data -> sync not yet reported
  std::unordered_map<int, std::vector<Written>> volatile_;  // file -> reported, not yet durable
  uint64_t reported_seq_ = 0;
  bool off_ = false;
  Observer observer_;
};

// Overwrites [offset, offset + len) of the file behind `fd` with zeros through a descriptor of
// its own (the original may be O_DIRECT, which wants aligned ranges), then syncs it.
Status zero_range(int fd, uint64_t offset, uint64_t len) {
  std::string p = "/proc/self/fd/" + std::to_string(fd);
  int z = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
  if (z < 0) return Status::from_errno(errno, "power loss: reopen " + p);
  static const std::vector<std::byte> zeros(1u << 20);
  Status st;
  while (len > 0 && st.is_ok()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, zeros.size()));
    ssize_t w = ::pwrite(z, zeros.data(), n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) st = Status::from_errno(w < 0 ? errno : EIO, "power loss: zero " + p);
    else offset += static_cast<uint64_t>(w), len -= static_cast<uint64_t>(w);
  }
  if (st.is_ok() && ::fdatasync(z) != 0) st = Status::from_errno(errno, "power loss: fdatasync " + p);
  ::close(z);
  return st;
}

Result<uint64_t> FaultBackendImpl::power_loss() {
  if (off_) return fail(Code::kInvalidArgument, "power loss: the device is already off");
  // What the inner backend still does would land after the zeros: let it finish first. Its
  // completions are held and fail with -EIO once reported.
  while (inner_->in_flight() > 0) {
    wait_readable(inner_->event_fd(), 100);
    scratch_.clear();
    inner_->reap(scratch_);
    for (const IoCompletion& c : scratch_) held_.push_back({c, Clock::now()});
  }
  std::vector<Written> lost;
  for (const auto& [ud, w] : issued_) lost.push_back(w);
  for (const auto& [file, ws] : volatile_) lost.insert(lost.end(), ws.begin(), ws.end());
  off_ = true;
  issued_.clear();
  syncs_.clear();
  volatile_.clear();
  delayed_.clear();
  uint64_t bytes = 0;
  Status st;
  for (const Written& w : lost) {
    auto fd = fds_.find(w.file);
    if (fd == fds_.end()) continue;
    if (Status z = zero_range(fd->second, w.offset, w.len); !z && st.is_ok()) st = z;
    bytes += w.len;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t wr = ::write(efd_, &one, sizeof one);  // report the held ones
  if (!st) return fail(st);
  return bytes;
}

}  // namespace

Result<std::unique_ptr<FaultBackend>> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                                         std::vector<FaultRule> rules, uint64_t seed) {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (efd < 0 || tfd < 0 || epfd < 0) {
    int err = errno;
    if (efd >= 0) ::close(efd);
    if (tfd >= 0) ::close(tfd);
    if (epfd >= 0) ::close(epfd);
    return fail(Status::from_errno(err, "fault backend: eventfd/timerfd/epoll"));
  }
  for (int fd : {inner->event_fd(), efd, tfd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      int err = errno;
      ::close(efd);
      ::close(tfd);
      ::close(epfd);
      return fail(Status::from_errno(err, "fault backend: epoll_ctl"));
    }
  }
  return std::unique_ptr<FaultBackend>(
      new FaultBackendImpl(std::move(inner), std::move(rules), seed, epfd, efd, tfd));
}

}  // namespace tier::nvme
