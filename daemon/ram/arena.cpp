#include "daemon/ram/arena.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "daemon/log.hpp"
#include "daemon/ram/prefault.hpp"
#include "tier/types.hpp"

namespace tier::daemon {

std::string arena_prefix(const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(state_dir, ec);
  if (ec) p = std::filesystem::absolute(state_dir, ec).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  uint32_t h = 2166136261u;  // FNV-1a 32: part of the arena naming layout
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "tierd-%08x", h);
  return buf;
}

std::string arena_object_name(const std::string& prefix, uint64_t pool_id, int32_t node) {
  return prefix + "-p" + std::to_string(pool_id) + "-n" + std::to_string(node);
}

int os_node_for(int32_t node) {
  static std::mutex mu;
  static std::set<int32_t> warned;
  bool have = numa_available() >= 0 && node >= 0 && node <= numa_max_node() &&
              numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node));
  if (have) return node;
  std::lock_guard lk(mu);
  if (warned.insert(node).second)
    log_warn("NUMA node {} of the topology does not exist in this kernel; its arenas are not "
             "bound (simulated topology)", node);
  return -1;
}

Result<std::string> find_hugetlbfs(HugePages h) {
  std::ifstream f("/proc/mounts");
  std::string line;
  const char* want = h == HugePages::k1G ? "pagesize=1024M" : "pagesize=2M";
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    std::string dev, mnt, type, opts;
    ls >> dev >> mnt >> type >> opts;
    if (type != "hugetlbfs") continue;
    bool has_size = opts.find("pagesize=") != std::string::npos;
    if (opts.find(want) != std::string::npos || (!has_size && h == HugePages::k2M)) return mnt;
  }
  return fail(Code::kUnsupported,
              std::string("hugepages = ") + std::string(hugepages_name(h)) +
                  " needs a hugetlbfs mount (mount -t hugetlbfs -o " + want +
                  " none /dev/hugepages" + (h == HugePages::k1G ? "1G" : "") +
                  ") or set hugetlbfs_mount");
}

uint64_t free_hugepages(HugePages h) {
  std::string path = h == HugePages::k1G
                         ? "/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages"
                         : "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
  std::ifstream f(path);
  uint64_t n = 0;
  f >> n;
  return n;
}

Status check_hugepages(HugePages h, const std::string& mount) {
  if (h == HugePages::kNone) return Status::ok();
  std::string size(hugepages_name(h));
  if (free_hugepages(h) == 0)
    return Status(Code::kInvalidArgument,
                  "hugepages = " + size + " but no " + size + " huge pages are reserved and free (reserve some: echo N > /sys/kernel/mm/hugepages/hugepages-" +
                      (h == HugePages::k1G ? "1048576kB" : "2048kB") + "/nr_hugepages)");
  if (mount.empty()) {
    auto m = find_hugetlbfs(h);
    if (!m) return Status(Code::kInvalidArgument, m.error().message());
  } else {
    struct stat sb;
    if (::stat(mount.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
      return Status(Code::kInvalidArgument, "hugetlbfs_mount '" + mount + "' is not a directory");
  }
  return Status::ok();
}

Result<std::unique_ptr<Arena>> Arena::create(const ArenaSpec& spec) { return open_object(spec, false); }

Result<std::unique_ptr<Arena>> Arena::attach(const ArenaSpec& spec) { return open_object(spec, true); }

Result<std::unique_ptr<Arena>> Arena::open_object(const ArenaSpec& spec, bool attach) {
  std::unique_ptr<Arena> a(new Arena());
  a->id_ = arena_id(spec.pool_id, spec.node);
  a->node_ = spec.node;
  std::string name = arena_object_name(spec.prefix, spec.pool_id, spec.node);
  uint64_t granule = kArenaSizeGranule;
  if (spec.hugepages != HugePages::kNone) {
    granule = std::max(granule, hugepage_bytes(spec.hugepages));
    std::string mnt = spec.hugetlbfs_mount;
    if (mnt.empty()) {
      auto m = find_hugetlbfs(spec.hugepages);
      if (!m) return fail(m.error());
      mnt = *m;
    }
    uint64_t need = (spec.size + granule - 1) / granule;
    uint64_t have = free_hugepages(spec.hugepages);
    if (!attach && have < need)
      return fail(Code::kResourceExhausted,
                  "an arena of " + format_size(need * granule) + " needs " + std::to_string(need) +
                      " free " + std::string(hugepages_name(spec.hugepages)) +
                      " huge pages but " + std::to_string(have) +
                      " are reserved and free (see /proc/sys/vm/nr_hugepages)");
    a->huge_ = true;
    a->path_ = mnt + "/" + name;
  } else {
    a->path_ = "/" + name;
  }
  a->size_ = (spec.size + granule - 1) / granule * granule;
  if (a->size_ == 0) a->size_ = granule;

  if (attach) {
    int fd = a->huge_ ? ::open(a->path_.c_str(), O_RDWR | O_CLOEXEC)
                      : ::shm_open(a->path_.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == ENOENT) return fail(Code::kNotFound, "arena " + a->path_ + " is gone");
      return fail(Status::from_errno(errno, "attach arena " + a->path_));
    }
    a->fd_ = fd;
    struct stat sb;
    if (::fstat(fd, &sb) != 0) return fail(Status::from_errno(errno, "stat arena " + a->path_));
    if (static_cast<uint64_t>(sb.st_size) != a->size_)
      return fail(Code::kCorruption, "arena " + a->path_ + " has " + std::to_string(sb.st_size) +
                                         " bytes, the journal recorded " + std::to_string(a->size_));
    void* p = ::mmap(nullptr, a->size_, PROT_READ | PROT_WRITE,
                     MAP_SHARED | (a->huge_ ? 0 : MAP_NORESERVE), fd, 0);
    if (p == MAP_FAILED) return fail(Status::from_errno(errno, "map arena " + a->path_));
    a->base_ = static_cast<std::byte*>(p);
    // The object keeps the NUMA policy the creating daemon set (shared memory carries it).
    a->os_node_ = os_node_for(spec.node);
    return a;
  }
  auto open_obj = [&]() -> int {
    if (a->huge_)
      return ::open(a->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    return ::shm_open(a->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  };
  int fd = open_obj();
  if (fd < 0 && errno == EEXIST) {
    // A leftover the journal does not describe (a restarted daemon re-attaches the arenas its
    // journal names with attach() and removes unknown ones first): start from an empty object.
    log_warn("replacing stale arena {}", a->path_);
    if (a->huge_) ::unlink(a->path_.c_str());
    else ::shm_unlink(a->path_.c_str());
    fd = open_obj();
  }
  if (fd < 0) return fail(Status::from_errno(errno, "create arena " + a->path_));
  a->fd_ = fd;
  auto cleanup_fail = [&](Status st) {
    if (a->huge_) ::unlink(a->path_.c_str());
    else ::shm_unlink(a->path_.c_str());
    return fail(std::move(st));
  };
  if (::fchown(fd, spec.owner, static_cast<gid_t>(-1)) != 0 && geteuid() == 0)
    return cleanup_fail(Status::from_errno(errno, "chown arena " + a->path_));
  if (::fchmod(fd, 0600) != 0) return cleanup_fail(Status::from_errno(errno, "chmod arena " + a->path_));
  if (::ftruncate(fd, static_cast<off_t>(a->size_)) != 0)
    return cleanup_fail(Status::from_errno(errno, "size arena " + a->path_));
  int flags = MAP_SHARED | (a->huge_ ? 0 : MAP_NORESERVE);
  void* p = ::mmap(nullptr, a->size_, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) return cleanup_fail(Status::from_errno(errno, "map arena " + a->path_));
  a->base_ = static_cast<std::byte*>(p);
  a->os_node_ = os_node_for(spec.node);
  if (a->os_node_ >= 0) {
    // Shared memory carries its policy in the object, so binding the daemon's mapping before
    // any page is touched places the pages every client later faults in.
    struct bitmask* mask = numa_allocate_nodemask();
    numa_bitmask_setbit(mask, static_cast<unsigned>(a->os_node_));
    long r = ::mbind(p, a->size_, MPOL_BIND, mask->maskp, mask->size + 1, 0);
    int err = errno;
    numa_free_nodemask(mask);
    if (r != 0) {
      ::munmap(p, a->size_);
      a->base_ = nullptr;
      return cleanup_fail(Status::from_errno(err, "mbind arena " + a->path_ + " to node " +
                                                      std::to_string(a->os_node_)));
    }
  }
  if (spec.prefault) {
    auto pf = prefault(a->base_, a->size_, a->os_node_, 0, a->huge_ ? granule : 4096);
    if (!pf) {
      ::munmap(p, a->size_);
      a->base_ = nullptr;
      return cleanup_fail(Status(Code::kResourceExhausted, pf.error().message()));
    }
    log_info("arena {}: {} prefaulted in {:.2f} s ({:.2f} s/GiB, {})", a->path_, format_size(a->size_),
             pf->seconds, pf->seconds / (static_cast<double>(a->size_) / (1ull << 30)),
             pf->populate_write ? "MADV_POPULATE_WRITE" : "page writes");
  }
  return a;
}

Arena::~Arena() {
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

Status Arena::unlink() {
  int r = huge_ ? ::unlink(path_.c_str()) : ::shm_unlink(path_.c_str());
  if (r != 0 && errno != ENOENT) return Status::from_errno(errno, "unlink arena " + path_);
  return Status::ok();
}

size_t remove_arenas(const std::string& prefix, const std::string& hugetlbfs_mount) {
  size_t n = 0;
  std::string want = prefix + "-";
  auto scan = [&](const std::string& dir, bool shm) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (!name.starts_with(want)) continue;
      int r = shm ? ::shm_unlink(("/" + name).c_str()) : ::unlink((dir + "/" + name).c_str());
      if (r == 0) ++n;
    }
    ::closedir(d);
  };
  scan("/dev/shm", true);
  if (!hugetlbfs_mount.empty()) scan(hugetlbfs_mount, false);
  return n;
}

}  // namespace tier::daemon
