// ExtentStore: the NVMe tier's space. One DirStore per NVMe directory (its preallocated data
// files and an ExtentAllocator over them), and placement across directories: a tensor larger
// than the stripe unit is cut into stripe-unit pieces dealt round-robin across directories
// (devices), so one fetch reads from every device at once; a smaller one goes to the directory
// with the most free space.
//
// On-disk layout of a directory: data-000000.tier, data-000001.tier, ... each exactly
// file_size bytes (fallocate'd when created, then the file and the directory fsync'd; files
// are created on demand up to the directory's capacity). With `prepare` (O_DIRECT directories
// only) every new file is written with zeros before it gets its name, one file ahead of use,
// by a FilePreparer (file_preparer.hpp says why and when); a leftover `.prep` file is removed. Nothing else
// is written: which extents are in use is the daemon's catalog (it replays them with reserve() after a
// restart).
//
// Not thread-safe: the daemon's loop serializes calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvme/extent_allocator.hpp"
#include "nvme/file_preparer.hpp"
#include "nvme/location.hpp"
#include "tier/status.hpp"

namespace tier::nvme {

struct DirConfig {
  std::string path;
  uint64_t capacity = 0;  // bytes this directory may use; 0 = 90% of its filesystem's free space
  int numa_node = -1;     // -1: detect from sysfs (the block device's node), else none
};

// Best effort: the NUMA node of the block device under `path`, -1 when unknown.
int detect_numa_node(const std::string& path);
// Whether `path` is on tmpfs/ramfs (no device behind it: O_DIRECT is meaningless there).
bool is_memory_filesystem(const std::string& path);

class DirStore {
 public:
  // Called when a data file is opened, with its descriptor; returns the backend's file index.
  using FileHook = std::function<Result<int>(int fd)>;

  // Opens (creating when missing) the directory and the data files already in it.
  // format: delete existing data files first. direct: open files with O_DIRECT. prepare: write
  // new files once before use (only with direct; see FilePreparer).
  static Result<std::unique_ptr<DirStore>> open(uint16_t index, const DirConfig& c, uint64_t file_size,
                                                bool format, bool direct, bool prepare, FileHook hook);
  ~DirStore();

  // One extent of round_up(len) bytes, creating a data file when needed; with allow_partial,
  // when no free range is that large, the largest free range instead (Extent::length says how
  // much). kResourceExhausted when the directory is full.
  [[nodiscard]] Result<Extent> allocate(uint64_t len, bool allow_partial);
  [[nodiscard]] Status release(const Extent& e);
  [[nodiscard]] Status reserve(const Extent& e);

  uint16_t index() const noexcept { return index_; }
  const std::string& path() const noexcept { return path_; }
  std::string file_path(uint32_t file) const;
  int backend_file(uint32_t file) const { return files_.at(file).backend_index; }
  int fd(uint32_t file) const { return files_.at(file).fd; }
  int numa_node() const noexcept { return numa_node_; }
  uint64_t capacity() const noexcept { return max_files_ * file_size_; }
  uint64_t used() const noexcept { return alloc_.used_bytes(); }
  uint64_t free_bytes() const noexcept { return capacity() - used(); }
  uint64_t file_bytes() const noexcept { return files_.size() * file_size_; }
  uint64_t file_size() const noexcept { return file_size_; }
  size_t files() const noexcept { return files_.size(); }
  // Engine I/O in flight or not: file preparation writes only while idle (see FilePreparer).
  void set_busy(bool busy) {
    if (prep_) prep_->set_busy(busy);
  }
  // Blocks until no file is being prepared (tests and benchmarks: a started tier is ready).
  void wait_prepared() {
    if (prep_) prep_->wait_idle();
  }
  uint64_t prepared_bytes() const noexcept { return prep_ ? prep_->bytes_written() : 0; }

 private:
  DirStore() : alloc_(kExtentAlign, 0) {}
  Status add_file();
  Status open_file(uint32_t n, bool create);
  Status use_file(uint32_t n, int fd);                       // registers an open data file and adds its range
  Status sync_new_file(int fd, const std::string& p) const;  // fsync of the file and directory

  struct File {
    int fd = -1;
    int backend_index = -1;
  };
  uint16_t index_ = 0;
  std::string path_;
  uint64_t file_size_ = 0, max_files_ = 0;
  bool direct_ = false;
  int numa_node_ = -1;
  FileHook hook_;
  std::vector<File> files_;
  ExtentAllocator alloc_;
  std::unique_ptr<FilePreparer> prep_;  // null: files are fallocate'd only
};

class ExtentStore {
 public:
  // No extent is longer than max_extent (the checksum granule: extents are hashed in parallel).
  ExtentStore(std::vector<std::unique_ptr<DirStore>> dirs, uint64_t stripe_unit, uint64_t max_extent);

  // Extents covering `size` bytes in order (see location.hpp); the checksums are left 0.
  // All or nothing: on failure nothing stays allocated.
  [[nodiscard]] Result<std::vector<Extent>> allocate(uint64_t size);
  // Frees every extent; returns the first error but frees the rest regardless.
  [[nodiscard]] Status release(const std::vector<Extent>& extents);
  // Marks the extents of a recorded location used (after a restart).
  [[nodiscard]] Status reserve(const std::vector<Extent>& extents);

  size_t dirs() const noexcept { return dirs_.size(); }
  DirStore& dir(size_t i) { return *dirs_.at(i); }
  const DirStore& dir(size_t i) const { return *dirs_.at(i); }
  uint64_t stripe_unit() const noexcept { return stripe_unit_; }
  void set_busy(bool busy) {
    for (auto& d : dirs_) d->set_busy(busy);
  }
  void wait_prepared() {
    for (auto& d : dirs_) d->wait_prepared();
  }

 private:
  [[nodiscard]] Status place(uint64_t len, size_t preferred, std::vector<Extent>& out);

  std::vector<std::unique_ptr<DirStore>> dirs_;
  uint64_t stripe_unit_, max_extent_;
  size_t next_dir_ = 0;  // round-robin start for the next striped tensor
};

}  // namespace tier::nvme
