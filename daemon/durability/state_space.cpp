// StateSpace: the snapshot floor and the journal's reserve (see state_space.hpp).
#include "durability/state_space.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "base/log.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

Result<StateSpace> StateSpace::open(const std::string& state_dir, const std::string& floor_text,
                                    const std::string& reserve_text) {
  StateSpace s;
  s.dir_ = state_dir;
  struct statvfs vfs{};
  if (::statvfs(state_dir.c_str(), &vfs) != 0) return fail(Status::from_errno(errno, "statvfs " + state_dir));
  const uint64_t total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  auto floor = parse_size(floor_text, total);
  if (!floor) return fail(Code::kInvalidArgument, "snapshot_free_floor: " + floor.error().message());
  auto reserve = parse_size(reserve_text, total);
  if (!reserve) return fail(Code::kInvalidArgument, "journal_reserve: " + reserve.error().message());
  s.floor_ = *floor;
  s.reserve_ = *reserve;
  s.reserve_path_ = state_dir + "/journal/reserve";
  s.fd_ = ::open(s.reserve_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (s.fd_ < 0) return fail(Status::from_errno(errno, "open " + s.reserve_path_));
  if (Status st = s.take_reserve(); !st) {
    // A full disk must not stop tierd from starting: it serves, and refuses snapshots.
    if (st.code() != Code::kResourceExhausted) return fail(std::move(st));
    log_warn("{}; snapshots are refused until the state dir's file system has room for it", st.message());
  }
  return s;
}

StateSpace& StateSpace::operator=(StateSpace&& o) noexcept {
  if (this == &o) return *this;
  if (fd_ >= 0) ::close(fd_);
  dir_ = std::move(o.dir_);
  reserve_path_ = std::move(o.reserve_path_);
  fd_ = std::exchange(o.fd_, -1);
  held_ = o.held_;
  floor_ = o.floor_;
  reserve_ = o.reserve_;
  return *this;
}

StateSpace::~StateSpace() {
  if (fd_ >= 0) ::close(fd_);
}

Status StateSpace::take_reserve() {
  if (reserve_ == 0) {
    held_ = true;
    return Status::ok();
  }
  // fallocate, not ftruncate: the blocks must really be taken from the file system.
  if (int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(reserve_)); err != 0) {
    (void)::ftruncate(fd_, 0);
    return Status::from_errno(
        err, "journal_reserve: preallocate " + format_size(reserve_) + " in " + reserve_path_);
  }
  if (::fdatasync(fd_) != 0) return Status::from_errno(errno, "fdatasync " + reserve_path_);
  held_ = true;
  return Status::ok();
}

bool StateSpace::release_reserve() {
  if (fd_ < 0 || !held_ || reserve_ == 0) return false;
  if (::ftruncate(fd_, 0) != 0) return false;
  held_ = false;
  log_warn(
      "the state dir's file system {} is full: released the journal's reserve of {}; snapshots are "
      "refused until it can be taken again",
      dir_, format_size(reserve_));
  return true;
}

Result<uint64_t> StateSpace::free_bytes() const {
  struct statvfs vfs{};
  if (::statvfs(dir_.c_str(), &vfs) != 0) return fail(Status::from_errno(errno, "statvfs " + dir_));
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

Status StateSpace::admit(uint64_t bytes, uint64_t pending) {
  if (fd_ < 0) return Status::ok();
  auto free = free_bytes();
  TIER_TRY(free);
  if (!held_) {
    // The reserve comes back first, out of the room above the floor.
    if (*free < floor_ + reserve_ || !take_reserve())
      return Status(Code::kResourceExhausted,
                    "snapshot refused: the state dir's file system has " + format_size(*free) +
                        " free, and the journal's reserve (" + format_size(reserve_) +
                        ", journal_reserve) must be taken back above the floor of " + format_size(floor_) +
                        " (snapshot_free_floor) first");
    log_info("journal reserve of {} taken again", format_size(reserve_));
    free = free_bytes();
    TIER_TRY(free);
  }
  const uint64_t need = bytes + pending;
  if (*free < floor_ || *free - floor_ < need)
    return Status(
        Code::kResourceExhausted,
        "snapshot refused: it needs " + format_size(bytes) +
            (pending > 0 ? " (and snapshots being written " + format_size(pending) + ")" : std::string()) +
            " of the state dir's file system, which has " + format_size(*free) + " free and keeps " +
            format_size(floor_) + " free (snapshot_free_floor)");
  return Status::ok();
}

}  // namespace tier::daemon
