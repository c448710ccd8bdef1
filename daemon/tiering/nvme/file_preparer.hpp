// FilePreparer: makes a directory's next data file ready on a background thread, so that
// spills never write into never-written blocks.
//
// Why: a fallocate'd file's blocks are allocated but *unwritten* (ext4, XFS): the first
// O_DIRECT write to each block converts its extent in a journal transaction at completion, and
// the spill's fdatasync must then commit that journal (fio on the development VM: 1.57 GB/s
// into a fresh fallocate'd file, 2.6-3.1 GB/s rewriting it). A prepared file has had every block
// written once (zeros), so a spill overwrites initialized blocks and its fdatasync is a cache
// flush, as in the steady state of a training job.
//
// How: `data-N.tier.prep` is created, fallocate'd, filled with zeros (sequential O_DIRECT
// writes of 8 MiB), fdatasync'd, renamed to `data-N.tier`, and the directory fsync'd. A data
// file's name therefore implies it is complete (a crash leaves at most a `.prep` file, which
// DirStore::open removes). Files written by an older tierd keep working as they are.
//
// When: one file ahead of use. The preparer writes only while the engine is idle (set_busy),
// so it never takes bandwidth from spills and fetches, unless an allocation is waiting for
// the file (take() makes it urgent). On a fresh tier the first file is prepared while the
// daemon starts; a multi-TB tier is prepared file by file as it fills, never all at start-up.
//
// Thread-safety: every public method is called from the engine's thread; the worker touches
// only its own .prep file and the state under mu_.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "tier/status.hpp"

namespace tier::nvme {

class FilePreparer {
 public:
  // dir: the directory; file_size: bytes per data file; direct: open with O_DIRECT.
  FilePreparer(std::string dir, uint64_t file_size, bool direct);
  ~FilePreparer();  // stops a preparation in progress and removes its .prep file
  FilePreparer(const FilePreparer&) = delete;
  FilePreparer& operator=(const FilePreparer&) = delete;

  // Starts preparing data file `index` in the background unless it is under way or ready.
  void start(uint32_t index);
  // Waits for data file `index` (starting it when needed, writing at full speed meanwhile) and
  // returns its descriptor, open O_RDWR (plus O_DIRECT when direct), now owned by the caller.
  // kResourceExhausted when the filesystem is full, kIo for other failures.
  [[nodiscard]] Result<int> take(uint32_t index);
  // Whether the engine has I/O in flight; preparation pauses while it has (unless urgent).
  void set_busy(bool busy);
  // Blocks until no preparation is in progress (the started one finished, or none was started).
  void wait_idle();
  // Zero bytes written by preparations so far (monitoring).
  uint64_t bytes_written() const noexcept { return written_.load(std::memory_order_relaxed); }

  static std::string prep_path(const std::string& data_path) { return data_path + ".prep"; }

 private:
  void run();
  // Makes `index` the file to prepare next, starting the worker on first use. Holds mu_.
  void want_locked(uint32_t index);
  Status prepare(uint32_t index, int& fd_out);
  // Waits while the engine is busy and nobody needs the file now; false when stopping.
  bool may_write();
  std::string data_path(uint32_t index) const;

  const std::string dir_;
  const uint64_t file_size_;
  const bool direct_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Under mu_:
  bool stop_ = false;
  bool urgent_ = false;
  bool working_ = false;  // a preparation is in progress
  int64_t want_ = -1;     // index to prepare next, -1 none
  int64_t ready_ = -1;    // index of the prepared file in ready_fd_, -1 none
  int ready_fd_ = -1;
  Status error_;  // the failed preparation of want_/ready_ index, reported by take()
  int64_t error_index_ = -1;
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> written_{0};
  std::thread worker_;
};

}  // namespace tier::nvme
