// IoQueue: whole transfers on top of a raw IoBackend.
//
// A transfer (op, file, offset, buffer, length) is split into requests of at most request_size
// bytes, at most queue_depth requests are in flight (the rest wait in a backlog, so the backend
// never runs out of submission slots), a short transfer is resubmitted for its remainder, and
// -EAGAIN is resubmitted up to max_retries times. The transfer completes exactly once: its
// callback gets the full length, or the first -errno (only after every request of the transfer
// already issued has completed, so the buffer is no longer in use by the device).
//
// A sync (op kSync, length 0, no buffer) is one request: an fdatasync of the file, queued ahead
// of transfers still waiting in the backlog, resubmitted on -EAGAIN like any request; its
// callback gets 0 or -errno. It covers the writes to the file
// whose callbacks ran before it was submitted (see IoBackend), so callers submit it from (or
// after) those callbacks.
//
// Threading: single driver thread. Callbacks run from poll()/wait()/drain(), never from inside
// submit(); they may submit new transfers. The destructor drains.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "nvme/io_backend.hpp"

namespace tier::nvme {

struct IoQueueOptions {
  uint32_t request_size = 1u << 20;  // bytes per request; a multiple of 4096 for O_DIRECT
  uint32_t max_retries = 1000;       // consecutive -EAGAIN / zero-byte results per request
};

struct IoQueueCounters {
  uint64_t requests = 0;       // requests issued to the backend, retries included
  uint64_t short_retries = 0;  // remainders resubmitted after a short transfer
  uint64_t eagain_retries = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t syncs = 0;  // syncs that completed successfully
};

class IoQueue {
 public:
  // result: the transfer's length on success, -errno on failure.
  using Done = std::function<void(int64_t result)>;

  IoQueue(std::unique_ptr<IoBackend> backend, IoQueueOptions o);
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // `buf` must stay valid until `done` runs. For kSync, offset, buf and len are ignored.
  void submit(IoOp op, int file, uint64_t offset, std::byte* buf, uint64_t len, Done done);
  // Reaps what the backend has, resubmits, runs callbacks; never blocks. Returns callbacks run.
  size_t poll();
  // Blocks until at least one callback ran, or returns at once when nothing is pending.
  void wait();
  // Runs until nothing is pending.
  void drain();

  bool idle() const noexcept { return live_ == 0; }
  size_t pending_transfers() const noexcept { return live_; }
  int event_fd() const noexcept { return backend_->event_fd(); }
  IoBackend& backend() noexcept { return *backend_; }
  const IoBackend& backend() const noexcept { return *backend_; }
  const IoQueueCounters& counters() const noexcept { return counters_; }
  uint32_t request_size() const noexcept { return opts_.request_size; }

 private:
  struct Transfer {
    IoOp op{};
    int file = -1;
    uint64_t offset = 0, len = 0, issued = 0;
    bool sync_issued = false;  // kSync: its one request was issued
    std::byte* buf = nullptr;
    uint32_t outstanding = 0;  // requests issued or waiting to be retried, not yet finished
    int32_t error = 0;
    Done done;
    bool live = false;
  };
  struct Chunk {
    uint32_t transfer = 0;
    uint64_t pos = 0;  // offset inside the transfer
    uint32_t len = 0;
    uint32_t tries = 0;
    bool live = false;
  };

  void pump();
  void issue(Chunk c);
  void on_completion(const IoCompletion& c);
  void maybe_finish(uint32_t t);
  static bool fully_issued(const Transfer& tr) noexcept {
    return tr.op == IoOp::kSync ? tr.sync_issued : tr.issued >= tr.len;
  }

  std::unique_ptr<IoBackend> backend_;
  IoQueueOptions opts_;
  IoQueueCounters counters_;
  std::vector<Transfer> transfers_;
  std::vector<uint32_t> free_transfers_;
  std::vector<Chunk> chunks_;  // indexed by IoRequest::user_data
  std::vector<uint32_t> free_chunks_;
  std::deque<Chunk> retries_;                    // resubmissions, issued before new requests
  std::deque<uint32_t> backlog_;                 // transfers with requests not yet issued
  std::vector<std::pair<Done, int64_t>> ready_;  // callbacks to run
  std::vector<IoCompletion> scratch_;
  size_t live_ = 0;
};

}  // namespace tier::nvme
