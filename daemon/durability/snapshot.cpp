// Durability: pool snapshots (start_snapshot/poll, the writer thread) and the reboot restore
// from the latest snapshot. See durability.hpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

#include "durability/durability.hpp"
#include "journal/manifest.hpp"
#include "base/log.hpp"
#include "nvme/location.hpp"
#include "core/catalog.hpp"
#include "ram/ram_tier.hpp"
#include "nvme/engine.hpp"
#include "wire/messages.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

namespace fs = std::filesystem;
using namespace tier::journal;

namespace {

constexpr const char* kDataName = "data";
constexpr const char* kManifestName = "manifest";

Status read_all(int fd, std::byte* p, uint64_t n, uint64_t off, const std::string& what) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, 64ull << 20), static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "read " + what);
    }
    if (r == 0) return Status(Code::kCorruption, what + " is shorter than its manifest says");
    p += r;
    n -= static_cast<uint64_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return Status::ok();
}

uint64_t now_unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

bool Durability::snapshot_running(uint64_t pool_id) const {
  for (const auto& j : jobs_)
    if (j->pool_id == pool_id) return true;
  return false;
}

Status Durability::start_snapshot(Pool& pool, uint64_t session_id, uint32_t request_id, uint16_t reply_type,
                                  uint64_t tag, uint32_t keep) {
  TIER_TRY(failed_);
  if (keep < 1 || keep > kMaxSnapshotsKept)
    return Status(Code::kInvalidArgument, "keep must be 1.." + std::to_string(kMaxSnapshotsKept) +
                                              " snapshots, not " + std::to_string(keep));
  for (const auto& j : jobs_)
    if (j->pool_id == pool.id)
      return Status(Code::kBusy, "a snapshot of pool '" + pool.name + "' is already running");
  uint64_t writers = 0;
  for (const auto& [id, t] : pool.tensors) writers += t.writer ? 1 : 0;
  if (writers > 0)
    return Status(Code::kBusy, "pool '" + pool.name + "' has " + std::to_string(writers) +
                                   " write leases held; a snapshot needs a point where nothing "
                                   "writes (retry after they are released)");
  // The state dir's space: a tenant's snapshots must not fill what the journal needs.
  const uint64_t estimate = snapshot_estimate(pool);
  uint64_t pending = 0;
  for (const auto& j : jobs_) pending += j->estimate;
  TIER_TRY(space_.admit(estimate, pending));
  auto t0 = std::chrono::steady_clock::now();
  auto job = std::make_unique<Job>();
  job->estimate = estimate;
  job->pool_id = pool.id;
  job->snapshot_id = next_snapshot_id(pool.id);
  job->session_id = session_id;
  job->request_id = request_id;
  job->reply_type = reply_type;
  job->keep = keep;
  // Ids are unique among the pool's snapshots, and a dropped snapshot's (or pool's) directory
  // is renamed away at once (remove_later), so this name is free.
  job->dir = snapshot_root() + "/" + pool.name + "/" + std::to_string(job->snapshot_id);
  job->pool = pool_record(pool);
  // The point: every tensor of the pool now, wherever its bytes are. Offsets are fixed here,
  // so tensors can be copied in any order (a write lease moves its tensor first).
  uint64_t off = 0;
  job->order.reserve(pool.tensors.size());
  for (const auto& [id, t] : pool.tensors) {
    Job::Entry e;
    e.meta = tensor_record(t);
    // Its RAM placement is the one it has when it is copied (hand_out), if any then.
    e.meta.arena_id = 0;
    e.meta.offset = e.meta.ram_length = 0;
    e.offset = off;
    off += t.size;
    job->entries.emplace(id, std::move(e));
    job->order.push_back(id);
  }
  auto w = SnapshotWriter::start(job->dir, off, efd_);
  TIER_TRY(w);
  job->writer = std::move(*w);
  append(SnapshotBegun{pool.id, job->snapshot_id, job->dir});
  if (tag != 0) append(SnapshotTagged{pool.id, job->snapshot_id, tag});
  feed(*job);
  job->stall_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  log_info("pool '{}': snapshot {} of {} tensors ({}) started; streaming", pool.name, job->snapshot_id,
           job->entries.size(), format_size(off));
  jobs_.push_back(std::move(job));
  return Status::ok();
}

uint64_t Durability::snapshot_estimate(const Pool& pool) {
  uint64_t bytes = 4096;  // the manifest's header and the directories
  for (const auto& [id, t] : pool.tensors)
    bytes += t.size + 256 + t.name.size() + 8 * t.shape.size();  // data and manifest record
  return bytes;
}

uint64_t Durability::measure_snapshot(const std::string& dir) {
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) return 0;
  uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (::lstat(e.path().c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  return bytes;
}

uint64_t Durability::snapshot_bytes(uint64_t pool_id) const {
  uint64_t bytes = 0;
  if (auto it = image_.pools().find(pool_id); it != image_.pools().end())
    for (const auto& [sid, snap] : it->second.snapshots) {
      if (!snap.durable) continue;
      auto d = snapshot_disk_.find({pool_id, sid});
      bytes += std::max(snap.bytes, d == snapshot_disk_.end() ? 0 : d->second);
    }
  for (const auto& j : jobs_)
    if (j->pool_id == pool_id) bytes += j->estimate;
  return bytes;
}

void Durability::hand_out(Job& job, uint64_t id, bool urgent) {
  auto it = job.entries.find(id);
  if (it == job.entries.end() || it->second.state != Job::State::kPending) return;
  Job::Entry& e = it->second;
  Tensor* t = deps_.catalog.find_tensor(id);
  if (!t || t->pool_id != job.pool_id) {  // deleted since the point: no restore asks for it
    e.state = Job::State::kLeftOut;
    return;
  }
  SnapshotWriter::Task task;
  task.tensor_id = id;
  task.size = t->size;
  task.data_offset = e.offset;
  if (t->ram) {
    Arena* a = deps_.ram.arena(t->ram->arena_id);
    int fd = a ? ::fcntl(a->fd(), F_DUPFD_CLOEXEC, 0) : -1;
    if (fd < 0) {
      log_error("pool '{}': snapshot {}: tensor '{}' left out: its arena cannot be read ({})", job.pool.name,
                job.snapshot_id, t->name, a ? std::strerror(errno) : "no such arena");
      e.state = Job::State::kLeftOut;
      return;
    }
    // Read from the shared-memory object, not the daemon's mapping: clients wrote most of
    // these pages through their own mappings, and faulting them into ours would be the cost.
    task.pieces.push_back({fd, {}, t->ram->offset, t->size, std::nullopt});
    e.meta = tensor_record(*t);
  } else if (t->nvme) {
    if (!deps_.nvme) {  // journaled on NVMe, but no NVMe tier configured now: not zeros
      log_error(
          "pool '{}': snapshot {}: tensor '{}' left out: its bytes are on NVMe and this tierd has "
          "no NVMe tier",
          job.pool.name, job.snapshot_id, t->name);
      e.state = Job::State::kLeftOut;
      return;
    }
    // Only on NVMe: its extents, each verified against its checksum as it is read.
    for (const nvme::Extent& x : t->nvme->extents)
      task.pieces.push_back({-1, deps_.nvme->file_path(x), x.offset, x.length, x.checksum});
  }  // else in no tier: zeros
  t->readers++;  // the pin: no eviction, delete or write lease until it is copied
  e.state = Job::State::kInFlight;
  job.in_flight++;
  job.in_flight_bytes += t->size;
  job.writer->submit(std::move(task), urgent);
}

void Durability::feed(Job& job) {
  while (job.next < job.order.size() && (job.in_flight == 0 || (job.in_flight_bytes < kSnapshotWindow &&
                                                                job.in_flight < kSnapshotWindowTensors)))
    hand_out(job, job.order[job.next++], false);
}

void Durability::unpin(Job& job, uint64_t id) {
  auto it = job.entries.find(id);
  if (it == job.entries.end() || it->second.state != Job::State::kInFlight) return;
  Tensor* t = deps_.catalog.find_tensor(id);
  if (t && t->readers > 0) t->readers--;
  job.in_flight--;
  job.in_flight_bytes -= std::min(job.in_flight_bytes, it->second.meta.size);
}

void Durability::copy_before_write(std::span<Tensor* const> tensors) {
  if (jobs_.empty()) return;
  for (Tensor* t : tensors)
    for (auto& job : jobs_)
      if (job->pool_id == t->pool_id && !job->finishing) hand_out(*job, t->id, true);
}

bool Durability::pinned(std::span<Tensor* const> tensors) const {
  for (const auto& job : jobs_)
    for (const Tensor* t : tensors)
      if (t->pool_id == job->pool_id)
        if (auto it = job->entries.find(t->id);
            it != job->entries.end() && it->second.state == Job::State::kInFlight)
          return true;
  return false;
}

Status Durability::poll(const Sink& sink, bool* released) {
  uint64_t x;
  while (::read(efd_, &x, sizeof x) == sizeof x) {}
  for (size_t i = 0; i < jobs_.size();) {
    Job& job = *jobs_[i];
    for (SnapshotWriter::Done& d : job.writer->take_done()) {
      unpin(job, d.tensor_id);
      if (released) *released = true;
      Job::Entry& e = job.entries.at(d.tensor_id);
      if (d.status) {
        e.state = Job::State::kDone;
        e.checksum = d.checksum;
        job.bytes += e.meta.size;
      } else {
        e.state = Job::State::kLeftOut;
        if (d.status.code() == Code::kCorruption) {
          log_error("pool '{}': snapshot {}: tensor '{}' left out: {}", job.pool.name, job.snapshot_id,
                    e.meta.name, d.status.message());
        } else if (!job.finishing) {  // the data file failed: the writer ends with that error
          job.finishing = true;
          job.writer->finish({}, {});
        }
      }
    }
    bool ended = job.writer->finished();
    if (!ended && !job.finishing) {
      feed(job);
      if (job.next == job.order.size() && job.in_flight == 0) {
        std::vector<Record> body;
        body.reserve(1 + 2 * job.entries.size());
        body.push_back(job.pool);
        for (const auto& [id, e] : job.entries) {
          if (e.state != Job::State::kDone) continue;
          body.push_back(e.meta);
          body.push_back(NvmeCopyWritten{
              id, job.snapshot_id, {Extent{job.dir, kDataName, e.offset, e.meta.size, e.checksum}}});
        }
        job.finishing = true;
        job.writer->finish(ManifestBegin{job.pool_id, job.snapshot_id, now_unix_ms()}, std::move(body));
      }
    }
    if (!ended) {
      ++i;
      continue;
    }
    // Tasks it never reported (it stopped on an error) hold pins: release them.
    for (auto& [id, e] : job.entries)
      if (e.state == Job::State::kInFlight) {
        unpin(job, id);
        e.state = Job::State::kLeftOut;
        if (released) *released = true;
      }
    complete(job, sink);
    jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return failed_;
}

void Durability::complete(Job& job, const Sink& sink) {
  Pool* pool = deps_.catalog.find_pool(job.pool_id);
  Status st = job.writer->result();
  job.writer.reset();  // joins the thread
  if (!pool) st = Status(Code::kNotFound, "pool '" + job.pool.name + "' was dropped during its snapshot");
  std::vector<std::byte> reply;
  if (st) {
    append(SnapshotDurable{job.pool_id, job.snapshot_id, job.dir, job.bytes});
    st = commit();  // durable in the journal before the caller hears so
    if (st) {
      snapshot_disk_[{job.pool_id, job.snapshot_id}] = measure_snapshot(job.dir);
      // Older snapshots of the pool go once this one is durable, but for the newest keep - 1
      // durable ones (a cut across nodes needs the previous one until every node has the new).
      std::vector<std::pair<uint64_t, std::string>> old;
      if (auto it = image_.pools().find(job.pool_id); it != image_.pools().end()) {
        uint32_t kept = 1;
        for (auto s = it->second.snapshots.rbegin(); s != it->second.snapshots.rend(); ++s) {
          if (s->first == job.snapshot_id) continue;
          if (s->first < job.snapshot_id && s->second.durable && kept < job.keep) {
            ++kept;
            continue;
          }
          if (s->first < job.snapshot_id) old.emplace_back(s->first, s->second.path);
        }
      }
      for (const auto& [sid, path] : old) {
        append(SnapshotDropped{job.pool_id, sid});
        remove_later(path);
      }
      log_info("pool '{}': snapshot {} durable ({}, loop time {} us)", job.pool.name, job.snapshot_id,
               format_size(job.bytes), job.stall_us);
      (void)wire::encode_reply(job.reply_type, job.request_id, Status::ok(),
                               wire::SnapshotRep{job.snapshot_id, job.bytes, job.stall_us}, reply);
    }
  }
  if (!st) {
    log_warn("pool '{}': snapshot {} failed: {}", job.pool.name, job.snapshot_id, st.message());
    if (pool) append(SnapshotDropped{job.pool_id, job.snapshot_id});
    remove_later(job.dir);
    (void)wire::encode_reply(job.reply_type, job.request_id, st, wire::Empty{}, reply);
  }
  if (sink) sink(job.session_id, reply);
}

Status Durability::restore_pool_from_snapshot(Pool& p, std::vector<Tensor*>& need, uint64_t* from) {
  auto pit = image_.pools().find(p.id);
  if (pit == image_.pools().end()) return Status::ok();
  const SnapshotImage* latest = nullptr;
  for (const auto& [sid, s] : pit->second.snapshots)
    if (s.durable) latest = &s;
  if (!latest) {
    log_warn("pool '{}': no durable snapshot to restore from", p.name);
    return Status::ok();
  }
  auto m = read_manifest(latest->path + "/" + kManifestName);
  if (m) *from = latest->snapshot_id;
  if (!m) {
    log_error("pool '{}': snapshot {} unusable: {}", p.name, latest->snapshot_id, m.error().message());
    return Status::ok();  // its tensors count as lost, loudly
  }
  std::map<uint64_t, Extent> where;  // tensor id -> its bytes in the data file
  for (const Record& r : m->body)
    if (const auto* w = std::get_if<NvmeCopyWritten>(&r); w && w->extents.size() == 1)
      where[w->tensor_id] = w->extents[0];
  std::string data = latest->path + "/" + kDataName;
  int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    log_error("pool '{}': snapshot data {}: {}", p.name, data, std::strerror(errno));
    return Status::ok();
  }
  std::vector<Tensor*> rest;
  for (Tensor* t : need) {
    auto it = where.find(t->id);
    Arena* a = deps_.ram.arena(t->ram->arena_id);
    if (it == where.end() || it->second.length != t->size || !a) {
      rest.push_back(t);
      continue;
    }
    std::byte* dst = a->base() + t->ram->offset;
    Status st = read_all(fd, dst, t->size, it->second.offset, data);
    if (st && XXH3_64bits(dst, t->size) != it->second.checksum)
      st = Status(Code::kCorruption, "checksum mismatch for tensor '" + t->name + "' in " + data);
    if (!st) {
      log_error("pool '{}': {}", p.name, st.message());
      std::memset(dst, 0, t->size);  // never serve damaged bytes
      rest.push_back(t);
      continue;
    }
    report_.restored_from_snapshot++;
  }
  ::close(fd);
  log_info("pool '{}': restored {} tensors from snapshot {}", p.name, need.size() - rest.size(),
           latest->snapshot_id);
  need = std::move(rest);
  return Status::ok();
}

}  // namespace tier::daemon

namespace tier::daemon {

namespace {

// Streams `x` of the data file through XXH3 (the manifest's checksum) without holding it whole.
Status verify_extent(int fd, const Extent& x, const std::string& what, std::vector<std::byte>& buf) {
  XXH3_state_t* h = XXH3_createState();
  if (!h) return Status(Code::kResourceExhausted, "no memory for a checksum state");
  XXH3_64bits_reset(h);
  Status st;
  for (uint64_t done = 0; done < x.length && st;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), x.length - done);
    st = read_all(fd, buf.data(), n, x.offset + done, what);
    if (st) XXH3_64bits_update(h, buf.data(), n);
    done += n;
  }
  if (st && XXH3_64bits_digest(h) != x.checksum)
    st = Status(Code::kCorruption, what + ": checksum mismatch at offset " + std::to_string(x.offset));
  XXH3_freeState(h);
  return st;
}

}  // namespace

Result<Durability::RestoreCounts> Durability::restore_snapshot(Pool& pool, uint64_t snapshot_id,
                                                               const RestoreHooks& hooks) {
  if (!failed_.is_ok()) return fail(failed_);
  if (snapshot_running(pool.id))
    return fail(Code::kBusy, "a snapshot of pool '" + pool.name + "' is running; restore after it ends");
  if (pool.leases > 0)
    return fail(Code::kBusy, "pool '" + pool.name + "' has " + std::to_string(pool.leases) +
                                 " leases held; a restore needs none (release them first)");
  auto pit = image_.pools().find(pool.id);
  if (pit == image_.pools().end()) return fail(Code::kInternal, "pool '" + pool.name + "' is not journaled");
  for (const auto& [tid, ti] : pit->second.tensors)
    if (ti.write_lease)
      return fail(
          Code::kBusy,
          "tensor '" + ti.meta.name + "' of pool '" + pool.name +
              "' is write-leased (reserved for its holder since a restart); a restore needs no leases");
  auto sit = pit->second.snapshots.find(snapshot_id);
  if (sit == pit->second.snapshots.end() || !sit->second.durable) {
    std::string have;
    for (const auto& [sid, s] : pit->second.snapshots)
      if (s.durable) have += (have.empty() ? "" : ", ") + std::to_string(sid);
    return fail(Code::kNotFound, "pool '" + pool.name + "' has no durable snapshot " +
                                     std::to_string(snapshot_id) +
                                     " (it has: " + (have.empty() ? "none" : have) + ")");
  }
  const std::string dir = sit->second.path;
  auto m = read_manifest(dir + "/" + kManifestName);
  if (!m)
    return fail(m.error().code(), "snapshot " + std::to_string(snapshot_id) + ": " + m.error().message());
  std::map<uint64_t, Extent> where;  // tensor id -> its bytes in the data file
  for (const Record& r : m->body)
    if (const auto* w = std::get_if<NvmeCopyWritten>(&r); w && w->extents.size() == 1)
      where[w->tensor_id] = w->extents[0];
  const std::string data = dir + "/" + kDataName;
  int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(Status::from_errno(errno, "open " + data));
  struct CloseFd {
    int fd;
    ~CloseFd() { ::close(fd); }
  } close_fd{fd};

  // Check everything before changing anything: sizes, then every checksum.
  std::vector<Tensor*> keep, drop;
  for (auto& [id, t] : pool.tensors) {
    auto it = where.find(id);
    if (it == where.end()) {
      drop.push_back(&t);
      continue;
    }
    if (it->second.length != t.size)
      return fail(Code::kCorruption, "snapshot " + std::to_string(snapshot_id) + " holds " +
                                         std::to_string(it->second.length) + " bytes of tensor '" + t.name +
                                         "', which has " + std::to_string(t.size));
    keep.push_back(&t);
  }
  std::vector<std::byte> buf(std::min<uint64_t>(uint64_t{8} << 20, std::max<uint64_t>(1, m->end.bytes)));
  for (Tensor* t : keep) TIER_TRY(verify_extent(fd, where[t->id], data + " (tensor '" + t->name + "')", buf));
  buf = {};

  RestoreCounts c;
  for (Tensor* t : drop) {
    hooks.erase(pool, *t);
    c.deleted++;
  }
  for (Tensor* t : keep) {
    auto dst = hooks.place(pool, *t);
    Status st = dst ? Status::ok() : dst.error();
    const Extent& x = where[t->id];
    if (st) st = read_all(fd, *dst, t->size, x.offset, data);
    if (st && XXH3_64bits(*dst, t->size) != x.checksum)
      st = Status(Code::kCorruption, data + " changed while it was restored (tensor '" + t->name + "')");
    if (!st) {
      if (dst) std::memset(*dst, 0, t->size);  // never serve damaged bytes
      log_error("pool '{}': restore of snapshot {} failed at tensor '{}' ({} of {} restored): {}", pool.name,
                snapshot_id, t->name, c.tensors, keep.size(), st.message());
      TIER_TRY(commit());
      return fail(st.code(), "restore of snapshot " + std::to_string(snapshot_id) + " failed at tensor '" +
                                 t->name +
                                 "' (the pool is partly restored; retry the restore): " + st.message());
    }
    c.tensors++;
    c.bytes += t->size;
  }
  std::vector<std::pair<uint64_t, std::string>> newer;
  for (const auto& [sid, s] : pit->second.snapshots)
    if (sid > snapshot_id) newer.emplace_back(sid, s.path);
  for (const auto& [sid, path] : newer) {
    append(SnapshotDropped{pool.id, sid});
    remove_later(path);
    c.dropped_snapshots++;
  }
  append(PoolRestored{pool.id, snapshot_id});
  TIER_TRY(commit());
  log_info("pool '{}': restored snapshot {}: {} tensors ({}), {} deleted, {} newer snapshots dropped",
           pool.name, snapshot_id, c.tensors, format_size(c.bytes), c.deleted, c.dropped_snapshots);
  return c;
}

uint64_t Durability::next_snapshot_id(uint64_t pool_id) {
  // Numbered per pool: one node-wide sequence told every tenant how many snapshots the others
  // took. Above every snapshot the pool has, and never one this process handed out before.
  uint64_t& next = next_snapshot_ids_[pool_id];
  if (auto it = image_.pools().find(pool_id); it != image_.pools().end() && !it->second.snapshots.empty())
    next = std::max(next, it->second.snapshots.rbegin()->first + 1);
  next = std::max<uint64_t>(next, 1);
  return next++;
}

}  // namespace tier::daemon
