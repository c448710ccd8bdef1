#include "leases/reclaim.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "durability/durability.hpp"
#include "base/log.hpp"
#include "ram/arena.hpp"
#include "ram/ram_tier.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

namespace {

// Reads a /proc file whole; nullopt with errno set when it cannot be opened or read.
std::optional<std::string> read_proc(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      errno = e;
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Field 22 (starttime) of a /proc/<pid>/stat line; the comm field (2) may hold spaces and
// parentheses, so counting starts after the last ')'.
uint64_t start_time_of(const std::string& stat) {
  size_t p = stat.rfind(')');
  if (p == std::string::npos) return 0;
  std::string_view rest(stat);
  rest.remove_prefix(p + 1);
  int field = 2;
  size_t i = 0;
  while (i < rest.size()) {
    while (i < rest.size() && rest[i] == ' ') ++i;
    size_t j = i;
    while (j < rest.size() && rest[j] != ' ') ++j;
    if (j == i) break;
    if (++field == 22) return std::strtoull(std::string(rest.substr(i, j - i)).c_str(), nullptr, 10);
    i = j;
  }
  return 0;
}

// Whether a /proc/<pid>/maps text has a writable mapping of (dev, ino). Lines:
// "start-end perms offset major:minor inode path".
bool maps_writable(const std::string& maps, dev_t dev, ino_t ino) {
  size_t pos = 0;
  while (pos < maps.size()) {
    size_t end = maps.find('\n', pos);
    if (end == std::string::npos) end = maps.size();
    std::string line = maps.substr(pos, end - pos);
    pos = end + 1;
    char perms[8] = {};
    unsigned long long offset = 0, inode = 0;
    unsigned maj = 0, min = 0;
    if (std::sscanf(line.c_str(), "%*x-%*x %7s %llx %x:%x %llu", perms, &offset, &maj, &min, &inode) != 5)
      continue;
    if (perms[1] == 'w' && inode == static_cast<unsigned long long>(ino) && maj == ::major(dev) &&
        min == ::minor(dev))
      return true;
  }
  return false;
}

std::string holder_text(const LeaseHolder& h) {
  return "pid " + std::to_string(h.pid) + ", uid " + std::to_string(h.uid);
}

}  // namespace

uint64_t process_start_time(pid_t pid) {
  if (pid <= 0) return 0;
  auto stat = read_proc("/proc/" + std::to_string(pid) + "/stat");
  return stat ? start_time_of(*stat) : 0;
}

uint64_t own_pid_ns() {
  struct stat sb;
  if (::stat("/proc/self/ns/pid", &sb) != 0) return 0;
  return static_cast<uint64_t>(sb.st_ino);
}

Liveness holder_liveness(const LeaseHolder& h, dev_t dev, ino_t ino) {
  if (h.pid <= 0 || h.pid_ns == 0 || h.pid_ns != own_pid_ns()) return Liveness::kUnknown;
  const std::string dir = "/proc/" + std::to_string(h.pid);
  auto stat = read_proc(dir + "/stat");
  if (!stat) return (errno == ENOENT || errno == ESRCH) ? Liveness::kGone : Liveness::kUnknown;
  if (h.pid_start != 0 && start_time_of(*stat) != h.pid_start) return Liveness::kGone;  // pid reused
  auto maps = read_proc(dir + "/maps");
  if (!maps) return (errno == ENOENT || errno == ESRCH) ? Liveness::kGone : Liveness::kUnknown;
  // A zombie or an exited process maps nothing; a live one that unmapped the arena (its
  // Client is gone) can no longer store into it.
  return maps_writable(*maps, dev, ino) ? Liveness::kAlive : Liveness::kGone;
}

Liveness ReclaimTable::liveness(const Parts& st, uint64_t tensor_id, const LeaseHolder& h) {
  Tensor* t = st.catalog.find_tensor(tensor_id);
  Arena* a = t && t->ram ? st.ram->arena(t->ram->arena_id) : nullptr;
  struct stat sb;
  if (!a || ::fstat(a->fd(), &sb) != 0) return Liveness::kUnknown;
  return holder_liveness(h, sb.st_dev, sb.st_ino);
}

void ReclaimTable::adopt(const Parts& st, Durability& d, Clock::time_point now) {
  const auto timeout = std::chrono::milliseconds(st.timeout_ms);
  // Collected first: ending a lease journals a record, which changes the image being walked.
  std::vector<journal::WriteLeaseHeld> held;
  for (const auto& [pid, pi] : d.image().pools())
    for (const auto& [tid, ti] : pi.tensors)
      if (ti.write_lease) held.push_back(*ti.write_lease);
  for (const journal::WriteLeaseHeld& w : held) {
    LeaseHolder h{static_cast<uid_t>(w.uid), w.pid, w.pid_start, w.pid_ns};
    Tensor* t = st.catalog.find_tensor(w.tensor_id);
    Pool* p = t ? st.catalog.find_pool(t->pool_id) : nullptr;
    if (!t || !p || !t->ram || d.arena_recreated(t->ram->arena_id)) {
      // The tensor's RAM copy is not the object the holder maps (a reboot recreated or restored
      // it, or it lives on NVMe now): nothing to reserve.
      if (t) d.write_lease_ended(*t);
      lost_[w.tensor_id] = {w.lease_id, h.uid, "its RAM copy did not survive the restart (a reboot?)"};
      continue;
    }
    if (timeout.count() == 0 || liveness(st, t->id, h) == Liveness::kGone) {
      std::string why = timeout.count() == 0
                            ? "lease_reclaim_timeout_ms = 0: no write lease is kept across a restart"
                            : "its holder was gone when tierd restarted";
      log_info(
          "pool '{}': tensor '{}' was write-leased by {} when tierd stopped; not kept ({}), the "
          "tensor keeps the bytes it left (dirty)",
          p->name, t->name, holder_text(h), why);
      d.write_lease_ended(*t);
      t->dirty = true;
      lost_[w.tensor_id] = {w.lease_id, h.uid, std::move(why)};
      continue;
    }
    Tensor* one[1] = {t};
    std::vector<uint64_t> ids;
    if (Status s = st.leases.acquire(session_, LeaseMode::kWrite, one, st.catalog, ids); !s) {
      log_error("internal: reserving tensor '{}' for its writer: {}", t->name, s.message());
      d.write_lease_ended(*t);
      continue;
    }
    t->dirty = true;  // the writer may have stored anything since the last write-back
    orphans_[t->id] = Orphan{w.lease_id, ids.front(), h, now + timeout};
    log_warn(
        "pool '{}': tensor '{}' was write-leased by {} when tierd stopped: reserved for it "
        "until it reclaims the lease (at most {} ms)",
        p->name, t->name, holder_text(h), st.timeout_ms);
  }
  next_recheck_ = now + kRecheck;
}

Result<uint64_t> ReclaimTable::reclaim(const Parts& st, SessionLeases& s, const LeaseHolder& who,
                                       uint64_t tensor_id, uint64_t lease_id) {
  // Another uid's lease is answered as one that does not exist: the answer must not tell
  // which tensors were under reclaim, nor who held them (an oracle for guessed ids).
  const Status none(Code::kNotFound, "tierd holds no write lease " + std::to_string(lease_id) +
                                         " on tensor " + std::to_string(tensor_id) +
                                         " of yours from before its restart");
  auto it = orphans_.find(tensor_id);
  if (it == orphans_.end() || it->second.old_lease_id != lease_id || it->second.holder.uid != who.uid) {
    auto lost = lost_.find(tensor_id);
    if (lost != lost_.end() && lost->second.old_lease_id == lease_id && lost->second.uid == who.uid) {
      std::string why = std::move(lost->second.why);
      lost_.erase(lost);
      return fail(Code::kUnavailable, "write lease " + std::to_string(lease_id) + " on tensor " +
                                          std::to_string(tensor_id) + " was lost: " + why);
    }
    return fail(none);
  }
  const Orphan& o = it->second;
  // The same uid; the same process where the pid means the same thing to both. Another
  // process of the holder's uid is told no more than that.
  bool same_ns = o.holder.pid_ns != 0 && o.holder.pid_ns == who.pid_ns;
  if (same_ns && o.holder.pid > 0 && who.pid > 0 &&
      (who.pid != o.holder.pid ||
       (o.holder.pid_start && who.pid_start && who.pid_start != o.holder.pid_start)))
    return fail(Code::kPermissionDenied, "write lease " + std::to_string(lease_id) + " on tensor " +
                                             std::to_string(tensor_id) + " is held by another process");
  auto id = st.leases.transfer(session_, s, o.lease_id);
  if (!id) return id;
  orphans_.erase(it);
  return id;
}

void ReclaimTable::end(const Parts& st, uint64_t tensor_id, uint64_t old_lease_id, std::string why) {
  auto it = orphans_.find(tensor_id);
  if (it == orphans_.end()) return;
  Tensor* t = st.catalog.find_tensor(tensor_id);
  Pool* p = t ? st.catalog.find_pool(t->pool_id) : nullptr;
  log_warn(
      "pool '{}': tensor '{}': the write lease of {} from before the restart is lost ({}); the "
      "tensor keeps the bytes it left (dirty)",
      p ? p->name : "?", t ? t->name : "?", holder_text(it->second.holder), why);
  // LeaseTable's write-end hook journals WriteLeaseEnded.
  (void)st.leases.release(session_, it->second.lease_id, st.catalog);
  if (t) t->dirty = true;
  lost_[tensor_id] = {old_lease_id, it->second.holder.uid, std::move(why)};
  orphans_.erase(it);
}

bool ReclaimTable::sweep(const Parts& st, Clock::time_point now) {
  if (orphans_.empty()) return false;
  const bool recheck = now >= next_recheck_;
  if (recheck) next_recheck_ = now + kRecheck;
  std::vector<std::pair<uint64_t, std::string>> ending;
  for (const auto& [tid, o] : orphans_) {
    if (now >= o.deadline)
      ending.emplace_back(tid,
                          "not reclaimed within lease_reclaim_timeout_ms = " + std::to_string(st.timeout_ms));
    else if (recheck && liveness(st, tid, o.holder) == Liveness::kGone)
      ending.emplace_back(tid, "its holder exited or unmapped the arena before reclaiming it");
  }
  for (auto& [tid, why] : ending) end(st, tid, orphans_.at(tid).old_lease_id, std::move(why));
  return !ending.empty();
}

std::optional<Clock::time_point> ReclaimTable::next_check() const noexcept {
  if (orphans_.empty()) return std::nullopt;
  Clock::time_point next = next_recheck_;
  for (const auto& [tid, o] : orphans_) next = std::min(next, o.deadline);
  return next;
}

}  // namespace tier::daemon
