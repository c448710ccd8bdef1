#include "journal/journal.hpp"
#include "base/errors.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tier::journal {
namespace {

// Compaction output is written in chunks of about this size.
constexpr size_t kCompactChunkBytes = 1 << 20;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

Status pwrite_all(int fd, std::span<const std::byte> bytes, uint64_t offset, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write " + what);
    }
    if (n == 0) return Status(Code::kIo, "write " + what + ": no progress");
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status datasync(int fd, const std::string& what) {
  if (::fdatasync(fd) != 0) return Status::from_errno(errno, "fdatasync " + what);
  return Status::ok();
}

}  // namespace

std::string_view fsync_policy_name(FsyncPolicy p) noexcept {
  switch (p) {
    case FsyncPolicy::kAlways: return "always";
    case FsyncPolicy::kBatch: return "batch";
    case FsyncPolicy::kNever: return "never";
  }
  return "?";
}

Result<FsyncPolicy> parse_fsync_policy(std::string_view s) {
  if (s == "always") return FsyncPolicy::kAlways;
  if (s == "batch") return FsyncPolicy::kBatch;
  if (s == "never") return FsyncPolicy::kNever;
  return fail(Code::kInvalidArgument,
              "journal fsync policy '" + std::string(s) + "' is not one of always, batch, never");
}

Result<std::vector<std::byte>> read_whole_file(int fd, const std::string& what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(Status::from_errno(errno, "stat " + what));
  std::vector<std::byte> data(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pread(fd, data.data() + done, data.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(Status::from_errno(errno, "read " + what));
    }
    if (n == 0) break;  // shrank under us; scan what we have
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

Status fsync_dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() < 0) return Status::from_errno(errno, "open directory " + dir);
  if (::fsync(d.get()) != 0) return Status::from_errno(errno, "fsync directory " + dir);
  return Status::ok();
}

Result<ScanResult> inspect_journal(const std::string& path, const RecordVisitor& visit) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return fail(Status::from_errno(errno, "open " + path));
  auto data = read_whole_file(fd.get(), path);
  TIER_TRY(data);
  auto res = scan(*data, kJournalMagic, visit);
  if (!res) return fail(res.error().code(), path + ": " + res.error().message());
  return res;
}

Result<std::unique_ptr<Journal>> Journal::open(const std::string& dir, const JournalOptions& options,
                                               const RecordVisitor& replay, OpenReport* report) {
  OpenReport rep;
  std::unique_ptr<Journal> j(new Journal());
  j->options_ = options;
  j->dir_ = dir;
  j->path_ = dir + "/" + std::string(kFileName);

  j->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (j->dir_fd_ < 0) return fail(Status::from_errno(errno, "open journal directory " + dir));
  j->lock_fd_ = ::openat(j->dir_fd_, std::string(kLockName).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (j->lock_fd_ < 0) return fail(Status::from_errno(errno, "open " + dir + "/catalog.lock"));
  if (::flock(j->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return fail(Code::kBusy, "the journal in " + dir + " is in use by another process");
    return fail(Status::from_errno(errno, "lock " + dir + "/catalog.lock"));
  }

  // A compaction that did not reach its rename: the old journal is still the truth.
  if (::unlinkat(j->dir_fd_, std::string(kCompactName).c_str(), 0) == 0) {
    rep.removed_stale_compaction = true;
    if (::fsync(j->dir_fd_) != 0) return fail(Status::from_errno(errno, "fsync directory " + dir));
  } else if (errno != ENOENT) {
    return fail(Status::from_errno(errno, "remove stale " + dir + "/" + std::string(kCompactName)));
  }

  bool fresh = false;
  j->fd_ = ::openat(j->dir_fd_, std::string(kFileName).c_str(), O_RDWR | O_CLOEXEC);
  if (j->fd_ < 0 && errno == ENOENT) {
    j->fd_ =
        ::openat(j->dir_fd_, std::string(kFileName).c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    fresh = true;
    rep.created = true;
  }
  if (j->fd_ < 0) return fail(Status::from_errno(errno, "open " + j->path_));

  uint64_t first_seq = 1;
  if (!fresh) {
    auto data = read_whole_file(j->fd_, j->path_);
    TIER_TRY(data);
    auto res = scan(*data, kJournalMagic, replay);
    if (!res) return fail(res.error().code(), j->path_ + ": " + res.error().message());
    rep.records = res->records;
    rep.dropped_tail_bytes = res->dropped_bytes;
    if (res->fresh) {
      fresh = true;  // an empty file, or one whose header write was torn
    } else {
      first_seq = res->first_seq;
      j->last_seq_ = res->last_seq;
      j->size_ = res->valid_end;
      j->base_bytes_ = uint64_t{res->base_kib} * 1024;
      if (res->dropped_bytes > 0) {
        if (::ftruncate(j->fd_, static_cast<off_t>(res->valid_end)) != 0)
          return fail(Status::from_errno(errno, "truncate the torn tail of " + j->path_));
        TIER_TRY(datasync(j->fd_, j->path_));
      }
    }
  }
  if (fresh) {
    if (::ftruncate(j->fd_, 0) != 0) return fail(Status::from_errno(errno, "truncate " + j->path_));
    std::vector<std::byte> hdr;
    encode_file_header(kJournalMagic, 1, 0, hdr);
    TIER_TRY(pwrite_all(j->fd_, hdr, 0, j->path_));
    TIER_TRY(datasync(j->fd_, j->path_));
    if (::fsync(j->dir_fd_) != 0) return fail(Status::from_errno(errno, "fsync directory " + dir));
    j->size_ = hdr.size();
    j->last_seq_ = 0;
    first_seq = 1;
  }
  j->committed_seq_ = j->last_seq_;
  rep.first_seq = first_seq;
  rep.last_seq = j->last_seq_;
  rep.bytes = j->size_;
  if (report) *report = rep;
  return j;
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

Status Journal::fail_with(Status st) {
  failed_ = st;
  return st;
}

Result<uint64_t> Journal::append(const Record& record) {
  if (!failed_) return fail(failed_);
  buf_.clear();
  const uint64_t seq = last_seq_ + 1;
  TIER_TRY(encode_record(record, seq, buf_));
  if (Status st = pwrite_all(fd_, buf_, size_, path_); !st) {
    // Part of the record may be on disk: cut it off, or later appends would follow garbage
    // and turn a harmless torn tail into corruption in the middle.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0)
      return fail(
          fail_with(Status(st.code(), st.message() + "; and truncating it failed: " + std::strerror(errno))));
    return fail(std::move(st));
  }
  size_ += buf_.size();
  last_seq_ = seq;
  if (options_.fsync == FsyncPolicy::kAlways) {
    if (Status st = datasync(fd_, path_); !st) return fail(fail_with(std::move(st)));
  }
  if (options_.fsync != FsyncPolicy::kBatch) committed_seq_ = seq;
  return seq;
}

Status Journal::sync() {
  if (!failed_) return failed_;
  if (committed_seq_ == last_seq_) return Status::ok();
  if (options_.fsync == FsyncPolicy::kBatch) {
    if (Status st = datasync(fd_, path_); !st) return fail_with(std::move(st));
  }
  committed_seq_ = last_seq_;
  return Status::ok();
}

bool Journal::compaction_due() const noexcept {
  return size_ >= options_.compact_min_bytes &&
         static_cast<double>(size_) > options_.compact_ratio * static_cast<double>(base_bytes_);
}

Status Journal::compact(std::span<const Record> live) {
  return compact([&](const Emit& emit) -> Status {
    for (const Record& r : live) TIER_TRY(emit(r));
    return Status::ok();
  });
}

Status Journal::compact(const std::function<Status(const Emit& emit)>& write_live) {
  if (!failed_) return failed_;
  const std::string tmp_path = dir_ + "/" + std::string(kCompactName);
  Fd tmp(::openat(dir_fd_, std::string(kCompactName).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (tmp.get() < 0) return Status::from_errno(errno, "create " + tmp_path);
  auto abandon = [&](Status st) {
    ::unlinkat(dir_fd_, std::string(kCompactName).c_str(), 0);
    return st;
  };

  const uint64_t first_seq = last_seq_ + 1;
  uint64_t seq = first_seq;
  uint64_t written = 0;  // bytes already in the temp file
  std::vector<std::byte> out;
  encode_file_header(kJournalMagic, first_seq, 0, out);  // rewritten with base_kib below
  Emit emit = [&](const Record& r) -> Status {
    TIER_TRY(encode_record(r, seq, out));
    ++seq;
    if (out.size() >= kCompactChunkBytes) {
      TIER_TRY(pwrite_all(tmp.get(), out, written, tmp_path));
      written += out.size();
      out.clear();
    }
    return Status::ok();
  };
  if (Status st = write_live(emit); !st) return abandon(std::move(st));
  if (Status st = pwrite_all(tmp.get(), out, written, tmp_path); !st) return abandon(std::move(st));
  written += out.size();

  const uint64_t records_bytes = written - kFileHeaderBytes;
  const uint64_t kib = (records_bytes + 1023) / 1024;
  std::vector<std::byte> hdr;
  encode_file_header(kJournalMagic, first_seq, static_cast<uint32_t>(std::min<uint64_t>(kib, UINT32_MAX)),
                     hdr);
  if (Status st = pwrite_all(tmp.get(), hdr, 0, tmp_path); !st) return abandon(std::move(st));
  // Always fsynced, whatever the policy: the rename must never expose a file whose bytes
  // are not on disk yet.
  if (Status st = datasync(tmp.get(), tmp_path); !st) return abandon(std::move(st));
  if (::renameat(dir_fd_, std::string(kCompactName).c_str(), dir_fd_, std::string(kFileName).c_str()) != 0)
    return abandon(Status::from_errno(errno, "rename " + tmp_path + " over " + path_));
  // From here the new file is the journal; if its directory entry cannot be made durable,
  // a power loss could bring back the old one without the records appended from now on.
  if (::fsync(dir_fd_) != 0) {
    ::close(fd_);
    fd_ = tmp.release();
    return fail_with(Status::from_errno(errno, "fsync directory " + dir_ + " after compaction"));
  }
  ::close(fd_);
  fd_ = tmp.release();
  size_ = written;
  base_bytes_ = records_bytes;
  last_seq_ = seq - 1;
  committed_seq_ = last_seq_;
  return Status::ok();
}

}  // namespace tier::journal
