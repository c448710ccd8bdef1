#include "nvme/file_preparer.hpp"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "nvme/location.hpp"
#include "base/errors.hpp"

namespace tier::nvme {
namespace {

constexpr uint64_t kChunk = uint64_t{8} << 20;  // bytes per zero write

struct FreeBuf {
  void operator()(void* p) const noexcept { std::free(p); }
};

}  // namespace

FilePreparer::FilePreparer(std::string dir, uint64_t file_size, bool direct)
    : dir_(std::move(dir)), file_size_(file_size), direct_(direct) {}

FilePreparer::~FilePreparer() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (ready_fd_ >= 0) ::close(ready_fd_);  // prepared and named: kept for the next open
}

std::string FilePreparer::data_path(uint32_t index) const {
  return fmt::format("{}/data-{:06}.tier", dir_, index);
}

void FilePreparer::start(uint32_t index) {
  std::lock_guard lk(mu_);
  if (ready_ == index || want_ == index || error_index_ == index) return;
  want_locked(index);
  cv_.notify_all();
}

void FilePreparer::want_locked(uint32_t index) {
  want_ = index;
  if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
}

Result<int> FilePreparer::take(uint32_t index) {
  std::unique_lock lk(mu_);
  if (ready_ != index && error_index_ != index && want_ != index) want_locked(index);
  urgent_ = true;
  cv_.notify_all();
  cv_.wait(lk, [&] { return ready_ == index || error_index_ == index; });
  urgent_ = false;
  if (ready_ == index) {
    int fd = ready_fd_;
    ready_ = -1;
    ready_fd_ = -1;
    return fd;
  }
  Status e = std::move(error_);
  error_ = Status::ok();
  error_index_ = -1;
  return fail(std::move(e));
}

void FilePreparer::set_busy(bool busy) {
  busy_.store(busy, std::memory_order_relaxed);
  if (!busy) cv_.notify_all();  // a missed wake-up costs at most may_write()'s poll interval
}

void FilePreparer::wait_idle() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !working_ && (want_ < 0 || want_ == ready_ || want_ == error_index_); });
}

bool FilePreparer::may_write() {
  std::unique_lock lk(mu_);
  while (!stop_ && !urgent_ && busy_.load(std::memory_order_relaxed))
    cv_.wait_for(lk, std::chrono::milliseconds(20));
  return !stop_;
}

void FilePreparer::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (want_ >= 0 && want_ != ready_ && want_ != error_index_); });
    if (stop_) return;
    auto index = static_cast<uint32_t>(want_);
    working_ = true;
    lk.unlock();
    int fd = -1;
    Status st = prepare(index, fd);
    lk.lock();
    working_ = false;
    if (want_ == index) want_ = -1;
    if (st.is_ok()) {
      ready_ = index;
      ready_fd_ = fd;
    } else {
      error_ = std::move(st);
      error_index_ = index;
    }
    cv_.notify_all();
  }
}

Status FilePreparer::prepare(uint32_t index, int& fd_out) {
  const std::string path = data_path(index), tmp = prep_path(path);
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (direct_ ? O_DIRECT : 0), 0600);
  if (fd < 0) return Status::from_errno(errno, "open " + tmp);
  auto give_up = [&](Status st) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  };
  if (::fallocate(fd, 0, 0, static_cast<off_t>(file_size_)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
    int err = errno;
    if (err == ENOSPC || err == EDQUOT)
      return give_up({Code::kResourceExhausted,
                      fmt::format("NVMe directory {} is full: cannot preallocate {} for {}: {}", dir_,
                                  file_size_, path, strerror(err))});
    return give_up(Status::from_errno(err, "fallocate " + tmp));
  }
  std::unique_ptr<void, FreeBuf> zeros(std::aligned_alloc(kExtentAlign, kChunk));
  if (!zeros) return give_up({Code::kResourceExhausted, "no memory to prepare " + path});
  std::memset(zeros.get(), 0, kChunk);
  for (uint64_t pos = 0; pos < file_size_;) {
    if (!may_write()) return give_up({Code::kUnavailable, "preparation of " + path + " stopped"});
    size_t len = static_cast<size_t>(std::min(kChunk, file_size_ - pos));
    ssize_t n = ::pwrite(fd, zeros.get(), len, static_cast<off_t>(pos));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      if (err == ENOSPC || err == EDQUOT)
        return give_up(
            {Code::kResourceExhausted,
             fmt::format("NVMe directory {} is full: cannot prepare {}: {}", dir_, path, strerror(err))});
      return give_up(Status::from_errno(err, fmt::format("write {} at offset {}", tmp, pos)));
    }
    pos += static_cast<uint64_t>(n);
    written_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  }
  if (::fdatasync(fd) != 0) return give_up(Status::from_errno(errno, "fdatasync " + tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return give_up(Status::from_errno(errno, "rename " + tmp));
  int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = dfd < 0 ? -1 : ::fsync(dfd);
  int err = errno;
  if (dfd >= 0) ::close(dfd);
  if (rc != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return Status::from_errno(err, "fsync directory " + dir_);
  }
  fd_out = fd;
  return Status::ok();
}

}  // namespace tier::nvme
