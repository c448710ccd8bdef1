// tierd's catalog journal: an append-only file of checksummed records in the state directory.
//
// The daemon appends one record per catalog change and, on start, rebuilds its catalog by
// replaying the journal (Journal::open). Compaction rewrites the journal as one record per live
// object. On-disk format: format.hpp; record types: records.hpp; recovery rules: reader.hpp;
// the whole story: docs/journal.md.
//
// Files in the directory:
//   catalog.journal          the journal
//   catalog.journal.compact  a compaction in progress (a leftover one is deleted at open)
//   catalog.lock             flock()ed for the Journal's lifetime: one writer per directory
//
// Thread-safety: none. A Journal is driven by the daemon's single event-loop thread.
// Failure model: after an I/O error the journal may not know what reached the disk (a failed
// fsync can drop dirty pages), so a failed write that cannot be undone, a failed fsync or a
// failed directory fsync makes the Journal "failed": every later call returns that error.
// The daemon must then stop acknowledging changes; restarting it recovers from the disk.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "journal/reader.hpp"
#include "journal/records.hpp"
#include "tier/status.hpp"

namespace tier::journal {

enum class FsyncPolicy : uint8_t {
  kAlways = 0,  // append() returns after fdatasync: each record is durable when acknowledged
  kBatch = 1,   // group commit: append() writes, sync() fdatasyncs everything appended so far
  kNever = 2,   // write only; survives a daemon crash (page cache), not a power loss
};
[[nodiscard]] std::string_view fsync_policy_name(FsyncPolicy p) noexcept;
// "always", "batch", "never".
[[nodiscard]] Result<FsyncPolicy> parse_fsync_policy(std::string_view s);

struct JournalOptions {
  FsyncPolicy fsync = FsyncPolicy::kBatch;
  // Compaction is due when the file exceeds compact_ratio × the live-state estimate (the bytes
  // the last compaction wrote) and compact_min_bytes. See compaction_due().
  double compact_ratio = 4.0;
  uint64_t compact_min_bytes = 4ull << 20;
};

struct OpenReport {
  bool created = false;                   // there was no journal: a new one was made
  bool removed_stale_compaction = false;  // a crashed compaction's temp file was deleted
  uint64_t records = 0;                   // replayed
  uint64_t first_seq = 1;
  uint64_t last_seq = 0;
  uint64_t bytes = 0;               // file size after recovery
  uint64_t dropped_tail_bytes = 0;  // torn tail truncated away (0 after a clean stop)
};

class Journal {
 public:
  static constexpr std::string_view kFileName = "catalog.journal";
  static constexpr std::string_view kCompactName = "catalog.journal.compact";
  static constexpr std::string_view kLockName = "catalog.lock";

  // Opens (or creates) the journal in `dir`, which must exist. Replays every valid record
  // through `replay` in order, truncates a torn tail (reported in `report`), and positions for
  // append. Errors: kNotFound (no dir), kBusy (another process holds the lock), kCorruption
  // (damage before the tail, naming the offset), kUnsupported (newer format or record type),
  // kIo, or whatever `replay` returned. On error nothing was modified on disk except a
  // deleted stale compaction temp file.
  [[nodiscard]] static Result<std::unique_ptr<Journal>> open(const std::string& dir,
                                                             const JournalOptions& options,
                                                             const RecordVisitor& replay,
                                                             OpenReport* report = nullptr);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Appends `record` and returns its sequence number. With kAlways it is durable on return;
  // with kBatch it is durable after the next successful sync(); with kNever it survives a
  // daemon crash but not a power loss. kInvalidArgument for an oversized record (nothing
  // written, the journal stays usable).
  [[nodiscard]] Result<uint64_t> append(const Record& record);

  // Makes every appended record durable (one fdatasync, skipped when nothing is pending).
  // The daemon calls it once per event-loop iteration, before sending the replies whose
  // records need durability. A no-op under kNever.
  [[nodiscard]] Status sync();

  uint64_t last_seq() const noexcept { return last_seq_; }
  // Every record with seq <= committed_seq() is as durable as the policy makes it: fsynced
  // under kAlways and kBatch, written under kNever. Replies for those may be sent.
  uint64_t committed_seq() const noexcept { return committed_seq_; }
  uint64_t size_bytes() const noexcept { return size_; }
  // The live-state estimate: bytes of records the last compaction wrote.
  uint64_t base_bytes() const noexcept { return base_bytes_; }
  const std::string& path() const noexcept { return path_; }
  // OK, or the error that failed the journal.
  const Status& health() const noexcept { return failed_; }

  // size_bytes() >= compact_min_bytes and size_bytes() > compact_ratio × base_bytes(). Since
  // each compaction resets base_bytes() to the live size, total compaction work stays
  // proportional to the bytes appended (the file at most quadruples between compactions).
  bool compaction_due() const noexcept;

  // Rewrites the journal as exactly the records `write_live` emits (one per live object:
  // the daemon's Watermarks, arenas, pools, tensors, copies, snapshots, in an order that
  // replays), atomically: written to catalog.journal.compact, fsynced, renamed over the
  // journal, directory fsynced. A crash at any point leaves either the old or the new journal.
  // Sequence numbers continue from last_seq(). If `write_live` or an emit fails, the old
  // journal stays in use and the error is returned.
  using Emit = std::function<Status(const Record&)>;
  [[nodiscard]] Status compact(const std::function<Status(const Emit& emit)>& write_live);
  [[nodiscard]] Status compact(std::span<const Record> live);

 private:
  Journal() = default;
  Status fail_with(Status st);

  JournalOptions options_;
  std::string dir_;
  std::string path_;
  int dir_fd_ = -1;
  int lock_fd_ = -1;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t base_bytes_ = 0;
  uint64_t last_seq_ = 0;
  uint64_t committed_seq_ = 0;
  Status failed_;
  std::vector<std::byte> buf_;  // reused encoding buffer
};

// Reads and validates the journal file at `path` without changing it (tools, tests): the same
// rules as open(), but a torn tail is only reported in ScanResult::dropped_bytes.
[[nodiscard]] Result<ScanResult> inspect_journal(const std::string& path, const RecordVisitor& visit);

// Whole-file helpers shared with manifest.cpp.
[[nodiscard]] Result<std::vector<std::byte>> read_whole_file(int fd, const std::string& what);
[[nodiscard]] Status fsync_dir_of(const std::string& path);

}  // namespace tier::journal
