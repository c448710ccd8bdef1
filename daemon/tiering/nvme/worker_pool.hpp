// WorkerPool<Job, Done>: worker threads that run jobs from one FIFO queue and hand each result
// back to the thread that owns the pool. The mechanics shared by HashPool (checksums, off the
// event loop) and ThreadPoolBackend (blocking pread/pwrite/fdatasync); each keeps its own job.
//
// Thread-safety:
// * submit() and take() may be called from any thread (they lock); in tierd one owner thread
//   (the engine's driver) calls them. stop() is called by the owner once it submits no more.
// * `run` and `on_start` are called on the worker threads, concurrently with one another: they
//   must only touch their own Job and what is safe to share.
// * After each job its result is queued for take(), then 1 is written to `notify_fd` (an
//   eventfd the owner polls). The pool never reads or closes that descriptor.
//
// Lifetime:
// * `notify_fd`, and whatever a Job points to, must stay valid until stop() has returned (or
//   the job's result has been taken).
// * stop() (the destructor calls it) lets the workers finish every queued job, then joins
//   them: nothing submitted is dropped. An owner whose members the jobs use calls stop() in its
//   own destructor, before those members go. submit() must not be called after stop().
// * With zero threads, submit() runs the job inline (its result still comes through take()).
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tier::nvme {

template <class Job, class Done> class WorkerPool {
 public:
  using Run = std::function<Done(Job&)>;

  // `on_start` (optional) runs once on each worker thread before its first job, e.g. to bind the
  // thread to a NUMA node.
  WorkerPool(unsigned threads, int notify_fd, Run run, std::function<void()> on_start = {})
      : notify_fd_(notify_fd), run_(std::move(run)), on_start_(std::move(on_start)) {
    workers_.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~WorkerPool() { stop(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(Job job) {
    if (workers_.empty()) {
      finish(run_(job));
      return;
    }
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // Appends the results finished since the last call to `out` and returns how many; never
  // blocks on a job.
  size_t take(std::vector<Done>& out) {
    std::lock_guard lk(done_mu_);
    size_t n = done_.size();
    out.insert(out.end(), std::make_move_iterator(done_.begin()), std::make_move_iterator(done_.end()));
    done_.clear();
    return n;
  }

  // Finishes the queued jobs and joins the workers. Idempotent.
  void stop() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
  }

  size_t threads() const noexcept { return workers_.size(); }

 private:
  void work() {
    if (on_start_) on_start_();
    for (;;) {
      Job job;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and the queue is drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      finish(run_(job));
    }
  }

  void finish(Done d) {
    {
      std::lock_guard lk(done_mu_);
      done_.push_back(std::move(d));
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(notify_fd_, &one, sizeof one);
  }

  const int notify_fd_;
  const Run run_;
  const std::function<void()> on_start_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // guarded by mu_
  bool stop_ = false;     // guarded by mu_
  std::mutex done_mu_;
  std::vector<Done> done_;            // guarded by done_mu_
  std::vector<std::thread> workers_;  // last: the threads start once everything above exists
};

}  // namespace tier::nvme
