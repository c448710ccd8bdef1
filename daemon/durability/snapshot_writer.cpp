#include "durability/snapshot_writer.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "journal/journal.hpp"
#include "journal/manifest.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

namespace fs = std::filesystem;

Status make_private_dir(const std::string& path) {
  std::string parent = fs::path(path).parent_path().string();
  if (!parent.empty() && parent != path && !fs::exists(parent)) TIER_TRY(make_private_dir(parent));
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return Status::from_errno(errno, "mkdir " + path);
  if (::chmod(path.c_str(), 0700) != 0) return Status::from_errno(errno, "chmod 0700 " + path);
  return Status::ok();
}

SnapshotWriter::Task::~Task() {
  for (Piece& p : pieces)
    if (p.fd >= 0) ::close(p.fd);
}

Result<std::unique_ptr<SnapshotWriter>> SnapshotWriter::start(std::string dir, uint64_t data_bytes, int efd) {
  std::unique_ptr<SnapshotWriter> w(new SnapshotWriter());
  w->dir_ = std::move(dir);
  w->data_bytes_ = data_bytes;
  w->efd_ = efd;
  w->buf_.reset(new (std::nothrow) std::byte[kChunk]);
  if (!w->buf_) return fail(Code::kResourceExhausted, "no memory for the snapshot's copy buffer");
  try {
    w->thread_ = std::thread([p = w.get()] { p->run(); });
  } catch (const std::system_error& e) {
    return fail(Code::kResourceExhausted, std::string("cannot start the snapshot writer: ") + e.what());
  }
  return w;
}

SnapshotWriter::~SnapshotWriter() {
  cancel();
  if (data_fd_ >= 0) ::close(data_fd_);
}

void SnapshotWriter::submit(Task t, bool urgent) {
  {
    std::lock_guard lk(mu_);
    if (urgent) queue_.push_front(std::move(t));
    else queue_.push_back(std::move(t));
  }
  cv_.notify_one();
}

std::vector<SnapshotWriter::Done> SnapshotWriter::take_done() {
  std::lock_guard lk(mu_);
  return std::exchange(done_, {});
}

void SnapshotWriter::finish(journal::ManifestBegin begin, std::vector<journal::Record> body) {
  {
    std::lock_guard lk(mu_);
    begin_ = begin;
    body_ = std::move(body);
    finishing_ = true;
  }
  cv_.notify_one();
}

void SnapshotWriter::cancel() {
  {
    std::lock_guard lk(mu_);
    cancelled_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool SnapshotWriter::finished() const {
  std::lock_guard lk(mu_);
  return ended_;
}

Status SnapshotWriter::result() const {
  std::lock_guard lk(mu_);
  return result_;
}

void SnapshotWriter::signal() {
  uint64_t one = 1;
  (void)!::write(efd_, &one, sizeof one);
}

void SnapshotWriter::run() {
  // Background work: the event loop (and the clients it serves) come first for the CPU.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  Status fatal = open_data();
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return cancelled_ || finishing_ || !queue_.empty(); });
    if (cancelled_ && fatal) fatal = Status(Code::kUnavailable, "the snapshot was cancelled");
    if (!queue_.empty()) {
      Task t = std::move(queue_.front());
      queue_.pop_front();
      Done d{t.tensor_id, 0, fatal};
      if (fatal) {
        lk.unlock();
        Status st = copy(t, d.checksum);
        // A source that fails its checksum leaves this tensor out; anything else (the data
        // file cannot be written) fails the snapshot.
        if (!st && st.code() != Code::kCorruption) fatal = st;
        d.status = std::move(st);
        lk.lock();
      }
      done_.push_back(std::move(d));
      signal();
      continue;
    }
    if (!fatal || cancelled_) break;
    if (finishing_) {
      lk.unlock();
      fatal = persist();
      lk.lock();
      break;
    }
  }
  result_ = std::move(fatal);
  ended_ = true;
  signal();
}

Status SnapshotWriter::open_data() {
  std::error_code ec;
  fs::remove_all(dir_, ec);  // a leftover of a crashed attempt with this id
  TIER_TRY(make_private_dir(dir_));
  std::string data = dir_ + "/data";
  data_fd_ = ::open(data.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (data_fd_ < 0) return Status::from_errno(errno, "create " + data);
  // Tensors in no tier (and tensors deleted before they were copied) stay holes: zeros.
  if (::ftruncate(data_fd_, static_cast<off_t>(data_bytes_)) != 0)
    return Status::from_errno(errno, "truncate " + data);
  return Status::ok();
}

Status SnapshotWriter::write_out(const std::byte* p, uint64_t n, uint64_t off) {
  uint64_t len = n;
  while (n > 0) {
    ssize_t w = ::pwrite(data_fd_, p, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write " + dir_ + "/data");
    }
    p += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
  // Bound the page cache the snapshot dirties: write the window out, then drop what is clean.
  unflushed_ += len;
  if (unflushed_ >= kFlushWindow) {
    unflushed_ = 0;
    (void)::sync_file_range(data_fd_, 0, 0,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    (void)::posix_fadvise(data_fd_, 0, 0, POSIX_FADV_DONTNEED);
  }
  return Status::ok();
}

Status SnapshotWriter::copy(Task& t, uint64_t& checksum) {
  XXH3_state_t* whole = XXH3_createState();
  XXH3_state_t* part = XXH3_createState();
  if (!whole || !part) {
    XXH3_freeState(whole);
    XXH3_freeState(part);
    return Status(Code::kResourceExhausted, "no memory for a checksum state");
  }
  XXH3_64bits_reset(whole);
  Status st;
  uint64_t dst = t.data_offset;
  if (t.pieces.empty()) {  // zeros: hashed, not written (the file's hole)
    std::memset(buf_.get(), 0, std::min(kChunk, t.size));
    for (uint64_t left = t.size; left > 0;) {
      uint64_t n = std::min(kChunk, left);
      XXH3_64bits_update(whole, buf_.get(), n);
      left -= n;
    }
  }
  for (Piece& p : t.pieces) {
    if (!st) break;
    bool own = p.fd < 0;
    int fd = own ? ::open(p.path.c_str(), O_RDONLY | O_CLOEXEC) : p.fd;
    if (fd < 0) {
      st = Status::from_errno(errno, "open " + p.path);
      break;
    }
    XXH3_64bits_reset(part);
    for (uint64_t done = 0; done < p.length && st;) {
      {
        std::lock_guard lk(mu_);
        if (cancelled_) st = Status(Code::kUnavailable, "the snapshot was cancelled");
      }
      if (!st) break;
      uint64_t n = std::min(kChunk, p.length - done);
      ssize_t r = ::pread(fd, buf_.get(), n, static_cast<off_t>(p.offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        st = r < 0 ? Status::from_errno(errno, "read " + (own ? p.path : "an arena"))
                   : Status(Code::kCorruption, "short read of " + (own ? p.path : "an arena"));
        break;
      }
      uint64_t got = static_cast<uint64_t>(r);
      XXH3_64bits_update(whole, buf_.get(), got);
      if (p.checksum) XXH3_64bits_update(part, buf_.get(), got);
      st = write_out(buf_.get(), got, dst);
      dst += got;
      done += got;
    }
    if (st && p.checksum && XXH3_64bits_digest(part) != *p.checksum)
      st = Status(Code::kCorruption,
                  "checksum mismatch in " + p.path + " at offset " + std::to_string(p.offset));
    if (own) {
      (void)::posix_fadvise(fd, static_cast<off_t>(p.offset), static_cast<off_t>(p.length),
                            POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  checksum = XXH3_64bits_digest(whole);
  XXH3_freeState(whole);
  XXH3_freeState(part);
  return st;
}

Status SnapshotWriter::persist() {
  std::string data = dir_ + "/data";
  if (::fdatasync(data_fd_) != 0) return Status::from_errno(errno, "fdatasync " + data);
  ::close(data_fd_);
  data_fd_ = -1;
  TIER_TRY(journal::write_manifest(dir_ + "/manifest", begin_, body_));
  TIER_TRY(journal::fsync_dir_of(dir_));                                // <pool>: its entry <id>
  return journal::fsync_dir_of(fs::path(dir_).parent_path().string());  // snapshots/: <pool>
}

}  // namespace tier::daemon
