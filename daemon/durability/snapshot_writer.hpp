// SnapshotWriter: the worker thread that streams one pool snapshot to
// <state-dir>/snapshots/<pool>/<id>/{data,manifest} (durability.hpp, docs/daemon.md
// "Snapshots").
//
// The event loop decides what is copied and when (it pins each tensor while it is copied, see
// Durability); the writer only moves bytes. Each task names one tensor's bytes where they are
// now: pieces of files (a dup of its arena's shared-memory fd, or the NVMe tier's data files),
// or none (a tensor in no tier: zeros, left as a hole in the data file). The writer reads them
// in chunks of kChunk bytes into one buffer, hashes them (XXH3, the tensor's checksum in the
// manifest), verifies each NVMe extent against its recorded checksum, and writes the chunk at
// the tensor's offset in the data file. Memory: one kChunk buffer per snapshot, whatever the
// pool's size; the data file's dirty pages are written out every kFlushWindow bytes and dropped
// from the page cache once on disk.
//
// The thread runs at nice 10: the event loop comes first for the CPU.
// finish() then makes it durable: fdatasync of the data file, the manifest (written atomically)
// and fsyncs of the snapshot's and the pool's directories. Every directory it creates is 0700.
//
// Thread-safety: submit/take_done/finish/cancel/finished/result are called by the loop thread
// only and synchronise with the worker through one mutex; the worker signals the loop through
// the eventfd given at start (readable when a task completed or the writer finished).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "journal/records.hpp"
#include "tier/status.hpp"

namespace tier::daemon {

// Creates `path` (and missing parents below an existing directory) with mode 0700, and makes
// an existing one 0700: snapshot directories name pools, which are other tenants' business.
[[nodiscard]] Status make_private_dir(const std::string& path);

class SnapshotWriter {
 public:
  static constexpr uint64_t kChunk = uint64_t{8} << 20;
  static constexpr uint64_t kFlushWindow = uint64_t{64} << 20;

  struct Piece {
    int fd = -1;          // owned by the task (closed by the writer); -1: open `path`
    std::string path;     // read-only, opened by the writer
    uint64_t offset = 0;  // in the source
    uint64_t length = 0;
    std::optional<uint64_t> checksum;  // an NVMe extent's XXH3: verified before it is used
  };
  struct Task {
    uint64_t tensor_id = 0;
    uint64_t size = 0;
    uint64_t data_offset = 0;   // in the snapshot's data file
    std::vector<Piece> pieces;  // in order, lengths adding up to `size`; empty: zeros
    Task() = default;
    Task(Task&&) noexcept = default;
    Task& operator=(Task&&) noexcept = default;
    ~Task();  // closes the owned fds of pieces never read
  };
  struct Done {
    uint64_t tensor_id = 0;
    uint64_t checksum = 0;  // XXH3 of the bytes written
    // Not ok: this tensor is not in the snapshot (kCorruption: its NVMe copy failed its
    // checksum; or the writer failed, see result()).
    Status status;
  };

  // Starts the thread; it creates `dir` (0700) and its data file of `data_bytes`.
  [[nodiscard]] static Result<std::unique_ptr<SnapshotWriter>> start(std::string dir, uint64_t data_bytes,
                                                                     int efd);
  ~SnapshotWriter();  // cancel() and join
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // Queues a task; `urgent` puts it first (a writer waits for that tensor).
  void submit(Task t, bool urgent);
  // The tasks completed since the last call.
  [[nodiscard]] std::vector<Done> take_done();
  // After the last task: persist the data file and write the manifest (begin + body).
  void finish(journal::ManifestBegin begin, std::vector<journal::Record> body);
  // Stops at the next chunk; queued tasks complete with kUnavailable. Waits for the thread.
  void cancel();
  // The thread has ended (finish() done, a fatal error, or cancel()).
  [[nodiscard]] bool finished() const;
  // OK once finish() made the snapshot durable; the first fatal error otherwise (valid once
  // finished()).
  [[nodiscard]] Status result() const;
  const std::string& dir() const noexcept { return dir_; }

 private:
  SnapshotWriter() = default;
  void run();
  [[nodiscard]] Status open_data();
  [[nodiscard]] Status copy(Task& t, uint64_t& checksum);
  [[nodiscard]] Status write_out(const std::byte* p, uint64_t n, uint64_t off);
  [[nodiscard]] Status persist();
  void signal();

  std::string dir_;
  uint64_t data_bytes_ = 0;
  int efd_ = -1;
  int data_fd_ = -1;
  uint64_t unflushed_ = 0;  // data-file bytes written since the last flush window
  std::unique_ptr<std::byte[]> buf_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<Done> done_;
  bool finishing_ = false, cancelled_ = false, ended_ = false;
  journal::ManifestBegin begin_;
  std::vector<journal::Record> body_;
  Status result_;
  std::thread thread_;
};

}  // namespace tier::daemon
