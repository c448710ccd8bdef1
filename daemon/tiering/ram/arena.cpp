#include "ram/arena.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "base/log.hpp"
#include "ram/fault_guard.hpp"
#include "ram/prefault.hpp"
#include "tier/types.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

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

int os_node_for(int32_t node) {
  static std::mutex mu;
  static std::set<int32_t> warned;
  bool have = numa_available() >= 0 && node >= 0 && node <= numa_max_node() &&
              numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node));
  if (have) return node;
  std::lock_guard lk(mu);
  if (warned.insert(node).second)
    log_warn(
        "NUMA node {} of the topology does not exist in this kernel; its arenas are not "
        "bound (simulated topology)",
        node);
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
  return fail(Code::kUnsupported, std::string("hugepages = ") + std::string(hugepages_name(h)) +
                                      " needs a hugetlbfs mount (mount -t hugetlbfs -o " + want +
                                      " none /dev/hugepages" + (h == HugePages::k1G ? "1G" : "") +
                                      ") or set hugetlbfs_mount");
}

uint64_t free_hugepages(HugePages h) {
  std::string path = h == HugePages::k1G ? "/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages"
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
    return Status(
        Code::kInvalidArgument,
        "hugepages = " + size + " but no " + size +
            " huge pages are reserved and free (reserve some: echo N > /sys/kernel/mm/hugepages/hugepages-" +
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

namespace {

constexpr size_t kIdentityHex = 32;

uint64_t round_up(uint64_t n, uint64_t g) { return (n + g - 1) / g * g; }

Status fill_identity(std::array<uint8_t, 16>& id) {
  size_t got = 0;
  while (got < id.size()) {
    ssize_t n = ::getrandom(id.data() + got, id.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "getrandom for an arena identity");
    got += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

std::string arena_object_name(const std::string& prefix, uint64_t pool_id, int32_t node,
                              const std::array<uint8_t, 16>& identity) {
  std::string s = prefix + "-p" + std::to_string(pool_id) + "-n" + std::to_string(node) + "-";
  static constexpr char kHex[] = "0123456789abcdef";
  for (uint8_t b : identity) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

bool arena_name_matches(const std::string& name, const std::string& prefix, uint64_t pool_id, int32_t node) {
  std::string head = prefix + "-p" + std::to_string(pool_id) + "-n" + std::to_string(node) + "-";
  if (name.size() != head.size() + kIdentityHex || !name.starts_with(head)) return false;
  for (size_t i = head.size(); i < name.size(); ++i) {
    char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status check_arena_identity(const struct stat& sb, uid_t euid) {
  if (!S_ISREG(sb.st_mode)) return Status(Code::kPermissionDenied, "it is not a regular file");
  if (sb.st_uid != euid)
    return Status(Code::kPermissionDenied, "it is owned by uid " + std::to_string(sb.st_uid) +
                                               ", not tierd's uid " + std::to_string(euid));
  if ((sb.st_mode & 07777) != 0600) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(sb.st_mode & 07777));
    return Status(Code::kPermissionDenied, std::string("its mode is ") + mode + ", not 0600");
  }
  if (sb.st_nlink != 1)
    return Status(Code::kPermissionDenied, "it has " + std::to_string(sb.st_nlink) + " links, not 1");
  return Status::ok();
}

Status check_shm_capacity(uint64_t ram, HugePages h, const std::string& shm_dir) {
  if (h != HugePages::kNone) return Status::ok();  // arenas live on hugetlbfs
  struct statfs fs;
  if (::statfs(shm_dir.c_str(), &fs) != 0)
    return Status(Code::kInvalidArgument, shm_dir + " is not usable (" + std::strerror(errno) +
                                              "): arenas are POSIX shared memory and need a tmpfs there");
  uint64_t size = static_cast<uint64_t>(fs.f_blocks) * static_cast<uint64_t>(fs.f_bsize);
  // 0: a tmpfs without a size limit. The slack of 1/64 lets the usual defaults (ram = "50%",
  // /dev/shm half the RAM in pages) pass, which differ by rounding only.
  if (size == 0 || size + ram / 64 >= ram) return Status::ok();
  std::string want = std::to_string((ram + (1ull << 30) - 1) >> 30) + "G";
  return Status(
      Code::kInvalidArgument,
      "the RAM tier (" + format_size(ram) + ") does not fit in " + shm_dir + " (a " + format_size(size) +
          " tmpfs): arenas past its size would fail with SIGBUS in "
          "clients. Raise it now with `mount -o remount,size=" +
          want + " " + shm_dir + "` and for good with the fstab line `tmpfs " + shm_dir +
          " tmpfs defaults,size=" + want + " 0 0` (or a systemd dev-shm.mount drop-in with Options=size=" +
          want + "), or lower `ram` to at most " + format_size(size));
}

Result<std::unique_ptr<Arena>> Arena::create(const ArenaSpec& spec) { return open_object(spec, false); }

Result<std::unique_ptr<Arena>> Arena::attach(const ArenaSpec& spec) { return open_object(spec, true); }

bool Arena::remove_object(const std::string& path, bool huge) {
  return (huge ? ::unlink(path.c_str()) : ::shm_unlink(path.c_str())) == 0;
}

Result<std::unique_ptr<Arena>> Arena::open_object(const ArenaSpec& spec, bool attach) {
  std::unique_ptr<Arena> a(new Arena());
  a->id_ = arena_id(spec.pool_id, spec.node);
  a->node_ = spec.node;
  a->prefault_ = spec.prefault;
  std::string dir;  // the hugetlbfs mount, or empty for shm
  uint64_t granule = kArenaSizeGranule;
  if (spec.hugepages != HugePages::kNone) {
    granule = std::max(granule, hugepage_bytes(spec.hugepages));
    dir = spec.hugetlbfs_mount;
    if (dir.empty()) {
      auto m = find_hugetlbfs(spec.hugepages);
      TIER_TRY(m);
      dir = *m;
    }
    a->huge_ = true;
  }
  a->granule_ = granule;
  a->size_ = round_up(spec.size, granule);
  if (a->size_ == 0) a->size_ = granule;

  if (attach) {
    a->path_ = spec.path;
    std::string base = a->path_.substr(a->path_.rfind('/') + 1);
    std::string parent = a->path_.substr(0, a->path_.size() - base.size());
    bool where_ok = a->huge_ ? parent == dir + "/" : parent == "/";
    if (!where_ok || !arena_name_matches(base, spec.prefix, spec.pool_id, spec.node))
      return fail(Code::kPermissionDenied,
                  "arena " + a->path_ + " is not named as tierd names the arenas of this pool");
    // O_NOFOLLOW: never through a symlink; O_NONBLOCK: a FIFO squatting the name cannot block
    // the start. Nothing is mapped before the identity checks pass.
    int flags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    int fd = a->huge_ ? ::open(a->path_.c_str(), flags) : ::shm_open(a->path_.c_str(), flags, 0600);
    if (fd < 0) {
      if (errno == ENOENT) return fail(Code::kNotFound, "arena " + a->path_ + " is gone");
      if (errno == ELOOP) return fail(Code::kPermissionDenied, "arena " + a->path_ + " is a symlink");
      return fail(Status::from_errno(errno, "attach arena " + a->path_));
    }
    a->fd_ = fd;
    struct stat sb;
    if (::fstat(fd, &sb) != 0) return fail(Status::from_errno(errno, "stat arena " + a->path_));
    if (Status id = check_arena_identity(sb, ::geteuid()); !id)
      return fail(id.code(), "arena " + a->path_ + " is not one tierd created: " + id.message());
    auto have = static_cast<uint64_t>(sb.st_size);
    if (have < spec.min_size || have > a->size_)
      return fail(Code::kCorruption, "arena " + a->path_ + " has " + std::to_string(have) +
                                         " bytes, the journal needs " + std::to_string(spec.min_size) +
                                         " to " + std::to_string(a->size_));
    a->committed_ = have;
    TIER_TRY(a->map_and_guard());
    // The object keeps the NUMA policy the creating daemon set on its whole reservation
    // (shared memory carries it), so pages committed later land on the node too.
    a->os_node_ = os_node_for(spec.node);
    return a;
  }
  std::array<uint8_t, 16> identity;
  TIER_TRY(fill_identity(identity));
  std::string name = arena_object_name(spec.prefix, spec.pool_id, spec.node, identity);
  a->path_ = a->huge_ ? dir + "/" + name : "/" + name;
  if (a->huge_) {
    uint64_t need = a->size_ / granule;
    uint64_t have = free_hugepages(spec.hugepages);
    if (have < need)
      return fail(Code::kResourceExhausted,
                  "an arena of " + format_size(a->size_) + " needs " + std::to_string(need) + " free " +
                      std::string(hugepages_name(spec.hugepages)) + " huge pages but " +
                      std::to_string(have) + " are reserved and free (see /proc/sys/vm/nr_hugepages)");
  }
  int oflags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = a->huge_ ? ::open(a->path_.c_str(), oflags, 0600) : ::shm_open(a->path_.c_str(), oflags, 0600);
  if (fd < 0) return fail(Status::from_errno(errno, "create arena " + a->path_));
  a->fd_ = fd;
  auto cleanup_fail = [&](Status st) {
    remove_object(a->path_, a->huge_);
    return fail(std::move(st));
  };
  // The object stays tierd's (created with its euid); 0600 whatever the umask.
  if (::fchmod(fd, 0600) != 0) return cleanup_fail(Status::from_errno(errno, "chmod arena " + a->path_));
  // hugetlbfs: a writable shared mapping sizes the file to the mapping anyway.
  a->committed_ = a->huge_ ? a->size_ : 0;
  if (a->committed_ > 0 && ::ftruncate(fd, static_cast<off_t>(a->committed_)) != 0)
    return cleanup_fail(Status::from_errno(errno, "size arena " + a->path_));
  if (Status st = a->map_and_guard(); !st) return cleanup_fail(std::move(st));
  a->os_node_ = os_node_for(spec.node);
  if (a->os_node_ >= 0) {
    // Shared memory carries its policy in the object, so binding the daemon's mapping of the
    // whole reservation before any page is touched places the pages every client later faults
    // in, however far the object grows.
    struct bitmask* mask = numa_allocate_nodemask();
    numa_bitmask_setbit(mask, static_cast<unsigned>(a->os_node_));
    long r = ::mbind(a->base_, a->size_, MPOL_BIND, mask->maskp, mask->size + 1, 0);
    int err = errno;
    numa_free_nodemask(mask);
    if (r != 0)
      return cleanup_fail(
          Status::from_errno(err, "mbind arena " + a->path_ + " to node " + std::to_string(a->os_node_)));
  }
  if (a->huge_ && spec.prefault) {
    auto pf = prefault(a->base_, a->size_, a->os_node_, 0, granule);
    if (!pf) return cleanup_fail(Status(Code::kResourceExhausted, pf.error().message()));
    log_info("arena {}: {} prefaulted in {:.2f} s", a->path_, format_size(a->size_), pf->seconds);
  }
  return a;
}

Status Arena::map_and_guard() {
  // The whole reservation is mapped; only [0, committed) is backed by the object. Nothing
  // touches the rest before commit() grew the object over it.
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | (huge_ ? 0 : MAP_NORESERVE), fd_, 0);
  if (p == MAP_FAILED) return Status::from_errno(errno, "map arena " + path_);
  base_ = static_cast<std::byte*>(p);
  fault_guard::install();
  guard_slot_ = fault_guard::add(base_, size_, fd_, committed_, path_.c_str());
  if (guard_slot_ < 0)
    log_warn("arena {}: no SIGBUS guard slot left; a truncation of it would stop tierd", path_);
  return Status::ok();
}

// A tmpfs object grows sparse: ftruncate past the file system's free space succeeds, and the
// first touch of a page with none left is a SIGBUS in whoever touches it (a trainer writing
// its lease). So what a commit is for must fit the space free now; the growth's slack is cut
// to it. Huge pages are reserved up front: no limit. ~0: unknown (ftruncate decides).
uint64_t Arena::free_space() const {
  struct statfs fs{};
  if (huge_ || ::fstatfs(fd_, &fs) != 0) return ~uint64_t{0};
  return uint64_t{fs.f_bavail} * static_cast<uint64_t>(fs.f_bsize);
}

Status Arena::commit(uint64_t end) {
  if (end <= committed_) return Status::ok();
  if (end > size_)
    return Status(Code::kInvalidArgument, "arena " + path_ + ": commit of " + std::to_string(end) +
                                              " bytes past its reservation of " + std::to_string(size_));
  uint64_t want = std::min(size_, round_up(std::max(end, committed_ + committed_ / 4), granule_));
  if (const uint64_t free = free_space(); want - committed_ > free) {
    const uint64_t need = std::min(size_, round_up(end, granule_));
    if (need - committed_ > free)
      return Status(Code::kResourceExhausted,
                    "arena " + path_ + ": growing by " + format_size(need - committed_) +
                        " does not fit the " + format_size(free) +
                        " free in its tmpfs (/dev/shm, shared with every other user of it): free space "
                        "there, enlarge it (mount -o remount,size=... /dev/shm) or lower tierd's --ram");
    want = std::max(need, committed_ + free / granule_ * granule_);
  }
  if (::ftruncate(fd_, static_cast<off_t>(want)) != 0)
    return Status::from_errno(errno, "grow arena " + path_ + " to " + std::to_string(want) + " bytes");
  if (prefault_) {
    auto pf = prefault(base_ + committed_, want - committed_, os_node_, 0, huge_ ? granule_ : 4096);
    if (!pf) {
      (void)!::ftruncate(fd_, static_cast<off_t>(committed_));
      return Status(Code::kResourceExhausted, pf.error().message());
    }
    log_info("arena {}: {} prefaulted in {:.2f} s ({:.2f} s/GiB, {})", path_, format_size(want - committed_),
             pf->seconds, pf->seconds / (static_cast<double>(want - committed_) / (1ull << 30)),
             pf->populate_write ? "MADV_POPULATE_WRITE" : "page writes");
  }
  committed_ = want;
  fault_guard::set_committed(guard_slot_, committed_);
  return Status::ok();
}

uint64_t Arena::repairs() const noexcept { return fault_guard::repairs(guard_slot_); }

Arena::~Arena() {
  fault_guard::remove(guard_slot_);
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
      std::string path = shm ? std::string("/") : dir + '/';
      path += name;
      int r = shm ? ::shm_unlink(path.c_str()) : ::unlink(path.c_str());
      if (r == 0) ++n;
    }
    ::closedir(d);
  };
  scan("/dev/shm", true);
  if (!hugetlbfs_mount.empty()) scan(hugetlbfs_mount, false);
  return n;
}

}  // namespace tier::daemon
