#include "nvme/extent_store.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/log.hpp"
#include "base/errors.hpp"

// Propagates a failed Status from a function returning Result<T>.
#define NVME_TRY(expr)                                                 \
  do {                                                                 \
    ::tier::Status nvme_try_ = (expr);                                 \
    if (!nvme_try_.is_ok()) return ::tier::fail(std::move(nvme_try_)); \
  } while (0)

namespace tier::nvme {
namespace fs = std::filesystem;

int detect_numa_node(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  std::error_code ec;
  fs::path dev = fs::canonical(fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev)), ec);
  if (ec) return -1;
  // A partition's device attributes live on its parent disk.
  for (int up = 0; up < 2; ++up, dev = dev.parent_path()) {
    std::ifstream f(dev / "device" / "numa_node");
    int node = -1;
    if (f >> node) return node;
  }
  return -1;
}

bool is_memory_filesystem(const std::string& path) {
  struct statfs s;
  if (::statfs(path.c_str(), &s) != 0) return false;
  return s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC;
}

std::string DirStore::file_path(uint32_t file) const {
  return fmt::format("{}/data-{:06}.tier", path_, file);
}

Result<std::unique_ptr<DirStore>> DirStore::open(uint16_t index, const DirConfig& c, uint64_t file_size,
                                                 bool format, bool direct, bool prepare, FileHook hook) {
  std::unique_ptr<DirStore> d(new DirStore());
  d->index_ = index;
  d->path_ = c.path;
  d->direct_ = direct;
  d->hook_ = std::move(hook);
  std::error_code ec;
  fs::create_directories(c.path, ec);
  if (ec) return fail(Code::kIo, fmt::format("create NVMe directory {}: {}", c.path, ec.message()));
  if (format) {
    for (uint32_t n = 0;; ++n) {
      if (::unlink(d->file_path(n).c_str()) != 0) break;
    }
  }
  // A preparation interrupted by a crash or a stop: never a data file, always removed.
  for (const auto& entry : fs::directory_iterator(c.path, ec)) {
    std::string name = entry.path().filename().string();
    if (name.starts_with("data-") && name.ends_with(".tier.prep")) ::unlink(entry.path().c_str());
  }
  uint64_t capacity = c.capacity;
  if (capacity == 0) {
    struct statvfs v;
    if (::statvfs(c.path.c_str(), &v) != 0) return fail(Status::from_errno(errno, "statvfs " + c.path));
    uint64_t existing = 0;
    for (uint32_t n = 0; fs::exists(d->file_path(n), ec); ++n) existing += fs::file_size(d->file_path(n), ec);
    capacity = (uint64_t(v.f_bavail) * v.f_frsize + existing) / 10 * 9;
  }
  file_size &= ~(kExtentAlign - 1);
  if (file_size == 0) file_size = kExtentAlign;
  if (capacity < file_size) file_size = capacity & ~(kExtentAlign - 1);
  if (file_size == 0)
    return fail(Code::kResourceExhausted,
                fmt::format("NVMe directory {} has no room for a data file", c.path));
  d->file_size_ = file_size;
  d->max_files_ = capacity / file_size;
  d->alloc_ = ExtentAllocator(kExtentAlign, file_size);
  d->numa_node_ = c.numa_node >= 0 ? c.numa_node : detect_numa_node(c.path);
  for (uint32_t n = 0; n < d->max_files_ && fs::exists(d->file_path(n), ec); ++n)
    NVME_TRY(d->open_file(n, false));
  if (prepare && direct) {
    d->prep_ = std::make_unique<FilePreparer>(c.path, file_size, direct);
    if (d->files_.size() < d->max_files_) d->prep_->start(static_cast<uint32_t>(d->files_.size()));
  }
  return d;
}

DirStore::~DirStore() {
  for (File& f : files_)
    if (f.fd >= 0) ::close(f.fd);
}

Status DirStore::sync_new_file(int fd, const std::string& p) const {
  if (::fsync(fd) != 0) return Status::from_errno(errno, "fsync " + p);
  int dfd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Status::from_errno(errno, "open directory " + path_);
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0) return Status::from_errno(err, "fsync directory " + path_);
  return Status::ok();
}

Status DirStore::open_file(uint32_t n, bool create) {
  std::string p = file_path(n);
  int flags = O_RDWR | O_CLOEXEC | (direct_ ? O_DIRECT : 0) | (create ? O_CREAT | O_EXCL : 0);
  int fd = ::open(p.c_str(), flags, 0600);
  if (fd < 0) return Status::from_errno(errno, "open " + p);
  if (create) {
    int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(file_size_));
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      log_warn("nvme: {}: fallocate unsupported, data file is sparse (space is not reserved)", p);
      rc = ::ftruncate(fd, static_cast<off_t>(file_size_));
    }
    if (rc != 0) {
      int err = errno;
      ::close(fd);
      ::unlink(p.c_str());
      if (err == ENOSPC || err == EDQUOT)
        return {Code::kResourceExhausted,
                fmt::format("NVMe directory {} is full: cannot preallocate {} for {}: {}", path_, file_size_,
                            p, strerror(err))};
      return Status::from_errno(err, "fallocate " + p);
    }
    // A spill's fdatasync covers its bytes and the extent conversion, not the file's existence:
    // the new file's size and allocation, and its name in the directory, are made durable now.
    if (Status st = sync_new_file(fd, p); !st) {
      ::close(fd);
      ::unlink(p.c_str());
      return st;
    }
  } else {
    struct stat st;
    if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < file_size_ &&
        ::ftruncate(fd, static_cast<off_t>(file_size_)) != 0) {
      int err = errno;
      ::close(fd);
      return Status::from_errno(err, "extend " + p);
    }
  }
  return use_file(n, fd);
}

Status DirStore::use_file(uint32_t n, int fd) {
  File f;
  f.fd = fd;
  if (hook_) {
    auto idx = hook_(fd);
    if (!idx) {
      ::close(fd);
      return idx.error();
    }
    f.backend_index = *idx;
  }
  files_.push_back(f);
  return alloc_.add_range(uint64_t(n) * file_size_, file_size_);
}

Status DirStore::add_file() {
  if (files_.size() >= max_files_)
    return {Code::kResourceExhausted,
            fmt::format("NVMe directory {} is full ({} of {} bytes used)", path_, used(), capacity())};
  auto n = static_cast<uint32_t>(files_.size());
  if (!prep_) return open_file(n, true);
  auto fd = prep_->take(n);
  TIER_TRY(fd);
  TIER_TRY(use_file(n, *fd));
  if (files_.size() < max_files_) prep_->start(n + 1);  // the next one, while the engine is idle
  return Status::ok();
}

Result<Extent> DirStore::allocate(uint64_t len, bool allow_partial) {
  len = std::min(len, file_size_);
  for (;;) {
    if (auto off = alloc_.allocate(len)) {
      return Extent{index_, static_cast<uint32_t>(*off / file_size_), *off % file_size_, len, 0};
    }
    if (files_.size() < max_files_) {
      NVME_TRY(add_file());
      continue;
    }
    uint64_t largest = alloc_.largest_free();
    if (allow_partial && largest > 0) {
      len = largest;
      continue;
    }
    return fail(Code::kResourceExhausted,
                fmt::format("NVMe directory {} is full: no free extent of {} bytes ({} of {} used)", path_,
                            len, used(), capacity()));
  }
}

Status DirStore::release(const Extent& e) {
  if (e.file >= files_.size())
    return {Code::kInvalidArgument, fmt::format("extent names missing data file {}", e.file)};
  return alloc_.release(uint64_t(e.file) * file_size_ + e.offset, allocated_bytes(e));
}

Status DirStore::reserve(const Extent& e) {
  while (e.file >= files_.size() && files_.size() < max_files_) TIER_TRY(add_file());
  if (e.file >= files_.size() || e.offset + allocated_bytes(e) > file_size_)
    return {Code::kInvalidArgument, fmt::format("extent {}+{} in file {} lies outside directory {}", e.offset,
                                                e.length, e.file, path_)};
  return alloc_.reserve(uint64_t(e.file) * file_size_ + e.offset, allocated_bytes(e));
}

ExtentStore::ExtentStore(std::vector<std::unique_ptr<DirStore>> dirs, uint64_t stripe_unit,
                         uint64_t max_extent)
    : dirs_(std::move(dirs)),
      stripe_unit_(std::max<uint64_t>(kExtentAlign, stripe_unit & ~(kExtentAlign - 1))),
      max_extent_(std::max<uint64_t>(kExtentAlign, max_extent & ~(kExtentAlign - 1))) {}

Status ExtentStore::place(uint64_t len, size_t preferred, std::vector<Extent>& out) {
  // Fill `len` bytes starting with the preferred directory, moving on as directories fill.
  Status last;
  for (size_t k = 0; k < dirs_.size() && len > 0; ++k) {
    DirStore& d = *dirs_[(preferred + k) % dirs_.size()];
    while (len > 0) {
      auto e = d.allocate(std::min(len, max_extent_), true);
      if (!e) {
        last = e.error();
        break;
      }
      len -= e->length;
      out.push_back(*e);
    }
  }
  if (len > 0) return last.is_ok() ? Status(Code::kResourceExhausted, "NVMe tier is full") : last;
  return Status::ok();
}

Result<std::vector<Extent>> ExtentStore::allocate(uint64_t size) {
  std::vector<Extent> out;
  if (dirs_.empty()) return fail(Code::kUnsupported, "no NVMe directory is configured");
  Status st;
  if (size <= stripe_unit_ || dirs_.size() == 1) {
    size_t best = 0;
    for (size_t i = 1; i < dirs_.size(); ++i)
      if (dirs_[i]->free_bytes() > dirs_[best]->free_bytes()) best = i;
    st = place(size, best, out);
  } else {
    size_t start = next_dir_++ % dirs_.size();
    for (uint64_t pos = 0, i = 0; pos < size && st.is_ok(); pos += stripe_unit_, ++i)
      st = place(std::min(stripe_unit_, size - pos), (start + i) % dirs_.size(), out);
  }
  if (!st.is_ok()) {
    (void)release(out);
    return fail(std::move(st));
  }
  return out;
}

Status ExtentStore::release(const std::vector<Extent>& extents) {
  Status first;
  for (const Extent& e : extents) {
    Status s = e.dir < dirs_.size() ? dirs_[e.dir]->release(e)
                                    : Status(Code::kInvalidArgument, "extent names unknown directory");
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  return first;
}

Status ExtentStore::reserve(const std::vector<Extent>& extents) {
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    Status s = e.dir < dirs_.size() ? dirs_[e.dir]->reserve(e)
                                    : Status(Code::kInvalidArgument, "extent names unknown directory");
    if (!s.is_ok()) {
      (void)release({extents.begin(), extents.begin() + static_cast<ptrdiff_t>(i)});
      return s;
    }
  }
  return Status::ok();
}

}  // namespace tier::nvme
