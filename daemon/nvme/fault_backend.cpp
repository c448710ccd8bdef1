#include "nvme/fault_backend.hpp"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <random>
#include <string>
#include <unordered_map>

namespace tier::nvme {
namespace {

using Clock = std::chrono::steady_clock;

class FaultBackendImpl final : public FaultBackend {
 public:
  FaultBackendImpl(std::unique_ptr<IoBackend> inner, std::vector<FaultRule> rules, uint64_t seed,
                   int epfd, int efd, int tfd)
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

  std::string_view name() const noexcept override { return name_; }
  Result<int> add_file(int fd) override { return inner_->add_file(fd); }
  bool register_memory(std::span<const MemRegion> r) override { return inner_->register_memory(r); }

  void submit(const IoRequest& req) override {
    ++in_flight_;  // every submit completes once: synthesized, held or from the inner backend
    const FaultRule* hit = nullptr;
    for (size_t i = 0; i < rules_.size() && hit == nullptr; ++i) {
      const FaultRule& r = rules_[i];
      if (r.op && *r.op != req.op) continue;
      if (fires_[i] >= r.max_fires) continue;
      uint64_t n = ++seen_[i];
      bool fire = r.nth != 0 ? n == r.nth
                             : std::uniform_real_distribution<double>(0, 1)(rng_) < r.probability;
      if (fire) {
        ++fires_[i];
        hit = &r;
      }
    }
    FaultKind kind = hit ? hit->kind : FaultKind::kDelay;
    if (hit && kind == FaultKind::kShort && req.len <= 4096) kind = FaultKind::kEagain;
    if (hit) ++fired_[static_cast<size_t>(kind)];
    if (hit == nullptr) {
      inner_->submit(req);
      return;
    }
    switch (kind) {
      case FaultKind::kEio: synthesize(req, -EIO); return;
      case FaultKind::kEnospc: synthesize(req, -ENOSPC); return;
      case FaultKind::kEagain: synthesize(req, -EAGAIN); return;
      case FaultKind::kShort: {
        IoRequest shorter = req;
        shorter.len = std::max<uint32_t>(4096, (req.len / 2) & ~uint32_t{4095});
        inner_->submit(shorter);
        return;
      }
      case FaultKind::kDelay:
        delayed_[req.user_data] = hit->delay_ms;
        inner_->submit(req);
        return;
    }
  }

  void flush() override { inner_->flush(); }

  size_t reap(std::vector<IoCompletion>& out) override {
    uint64_t v;
    while (::read(efd_, &v, sizeof v) == sizeof v) {
    }
    while (::read(tfd_, &v, sizeof v) == sizeof v) {
    }
    size_t before = out.size();
    out.insert(out.end(), synthetic_.begin(), synthetic_.end());
    synthetic_.clear();
    scratch_.clear();
    inner_->reap(scratch_);
    auto now = Clock::now();
    for (const IoCompletion& c : scratch_) {
      auto it = delayed_.find(c.user_data);
      if (it == delayed_.end()) {
        out.push_back(c);
        continue;
      }
      held_.push_back({c, now + std::chrono::milliseconds(it->second)});
      delayed_.erase(it);
    }
    Clock::time_point next = Clock::time_point::max();
    for (size_t i = 0; i < held_.size();) {
      if (held_[i].due <= now) {
        out.push_back(held_[i].c);
        held_[i] = held_.back();
        held_.pop_back();
      } else {
        next = std::min(next, held_[i].due);
        ++i;
      }
    }
    if (next != Clock::time_point::max()) arm(next - now);
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
};

}  // namespace

Result<std::unique_ptr<FaultBackend>> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                                         std::vector<FaultRule> rules,
                                                         uint64_t seed) {
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
