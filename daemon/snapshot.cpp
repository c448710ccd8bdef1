// Durability: pool snapshots (start_snapshot/poll, the writer thread) and the reboot restore
// from the latest snapshot. See durability.hpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>

#include "daemon/durability.hpp"
#include "daemon/journal/manifest.hpp"
#include "daemon/log.hpp"
#include "daemon/state.hpp"
#include "wire/messages.hpp"

namespace tier::daemon {

namespace fs = std::filesystem;
using namespace tier::journal;

namespace {

constexpr const char* kDataName = "data";
constexpr const char* kManifestName = "manifest";

Status write_all(int fd, const std::byte* p, uint64_t n, uint64_t off, const std::string& what) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, 64ull << 20), static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write " + what);
    }
    p += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return Status::ok();
}

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

void Durability::Job::Staging::reset() noexcept {
  if (p) ::munmap(p, n);
  p = nullptr;
}

Status Durability::start_snapshot(Pool& pool, uint64_t session_id, uint32_t request_id) {
  if (!failed_.is_ok()) return failed_;
  for (const auto& j : jobs_)
    if (j->pool_id == pool.id)
      return Status(Code::kBusy, "a snapshot of pool '" + pool.name + "' is already running");
  uint64_t writers = 0;
  for (const auto& [id, t] : pool.tensors) writers += t.writer ? 1 : 0;
  if (writers > 0)
    return Status(Code::kBusy, "pool '" + pool.name + "' has " + std::to_string(writers) +
                                   " write leases held; a snapshot needs a point where nothing "
                                   "writes (retry after they are released)");
  auto t0 = std::chrono::steady_clock::now();
  auto job = std::make_unique<Job>();
  job->pool_id = pool.id;
  job->snapshot_id = image_.watermarks().next_snapshot_id;
  job->session_id = session_id;
  job->request_id = request_id;
  job->dir = snapshot_root() + "/" + pool.name + "/" + std::to_string(job->snapshot_id);
  job->pool = pool_record(pool);
  job->efd = efd_;
  uint64_t total = 0;
  for (const auto& [id, t] : pool.tensors)
    if (t.ram) total += t.size;
  job->staging.n = total ? total : 1;
  void* mem = ::mmap(nullptr, job->staging.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem != MAP_FAILED) {
    job->staging.p = static_cast<std::byte*>(mem);
  }
  if (!job->staging)
    return Status(Code::kResourceExhausted, "snapshot of pool '" + pool.name + "' needs " +
                                                format_size(total) + " of staging memory");
  // The point-in-time copy: the event loop grants no lease while it runs and no write lease is
  // held, so every tensor is copied as of this instant.
  uint64_t off = 0;
  for (const auto& [id, t] : pool.tensors) {
    if (!t.ram) continue;  // only on NVMe: restored from its journaled NVMe copy
    Arena* a = st_.ram->arena(t.ram->arena_id);
    if (!a) continue;
    // pread from the shared-memory object rather than memcpy from the daemon's mapping: the
    // daemon never touched most of these pages (clients wrote them through their own mappings),
    // and faulting them in one by one would dominate the stall.
    if (Status rs = read_all(a->fd(), job->staging.get() + off, t.size, t.ram->offset, a->path()); !rs) {
      job->staging.reset();
      return rs;
    }
    TensorCreated m;
    m.pool_id = pool.id;
    m.tensor_id = t.id;
    m.name = t.name;
    m.size = t.size;
    m.dtype = static_cast<uint8_t>(t.dtype);
    m.shape = t.shape;
    m.numa_node = t.ram->node;
    m.arena_id = t.ram->arena_id;
    m.offset = t.ram->offset;
    m.ram_length = t.ram->length;
    job->tensors.push_back(std::move(m));
    job->offsets.push_back(off);
    off += t.size;
  }
  job->bytes = off;
  job->stall_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  append(SnapshotBegun{pool.id, job->snapshot_id, job->dir});
  Job* raw = job.get();
  try {
    job->thread = std::thread([raw] { write_job(*raw); });
  } catch (const std::system_error& e) {
    append(SnapshotDropped{pool.id, raw->snapshot_id});
    return Status(Code::kResourceExhausted, std::string("cannot start the snapshot writer: ") + e.what());
  }
  log_info("pool '{}': snapshot {} of {} tensors ({}) copied in {} us; persisting", pool.name,
           job->snapshot_id, job->tensors.size(), format_size(job->bytes), job->stall_us);
  jobs_.push_back(std::move(job));
  return Status::ok();
}

// The writer thread: data file, checksums, manifest, each fsynced, then the directories.
void Durability::write_job(Job& job) {
  auto run = [&]() -> Status {
    std::error_code ec;
    fs::remove_all(job.dir, ec);  // a leftover of a crashed attempt with this id
    fs::create_directories(job.dir, ec);
    if (ec) return Status(Code::kIo, "create " + job.dir + ": " + ec.message());
    std::string data = job.dir + "/" + kDataName;
    int fd = ::open(data.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Status::from_errno(errno, "create " + data);
    Status st = write_all(fd, job.staging.get(), job.bytes, 0, data);
    if (st && ::fdatasync(fd) != 0) st = Status::from_errno(errno, "fdatasync " + data);
    ::close(fd);
    TIER_RETURN_IF_ERROR(st);
    std::vector<Record> body;
    body.reserve(1 + 2 * job.tensors.size());
    body.push_back(job.pool);
    for (size_t i = 0; i < job.tensors.size(); ++i) {
      const TensorCreated& m = job.tensors[i];
      uint64_t sum = XXH3_64bits(job.staging.get() + job.offsets[i], m.size);
      body.push_back(m);
      body.push_back(NvmeCopyWritten{m.tensor_id, job.snapshot_id,
                                     {Extent{job.dir, kDataName, job.offsets[i], m.size, sum}}});
    }
    job.staging.reset();  // the bytes are on disk: give the memory back early
    TIER_RETURN_IF_ERROR(write_manifest(job.dir + "/" + kManifestName,
                                        ManifestBegin{job.pool.pool_id, job.snapshot_id, now_unix_ms()}, body));
    TIER_RETURN_IF_ERROR(fsync_dir_of(job.dir));                                   // <pool>/<id>
    TIER_RETURN_IF_ERROR(fsync_dir_of(fs::path(job.dir).parent_path().string()));  // <pool>
    return Status::ok();
  };
  job.result = run();
  job.done.store(true, std::memory_order_release);
  uint64_t one = 1;
  (void)!::write(job.efd, &one, sizeof one);
}

Status Durability::poll(const Sink& sink) {
  uint64_t x;
  while (::read(efd_, &x, sizeof x) == sizeof x) {}
  for (size_t i = 0; i < jobs_.size();) {
    Job& job = *jobs_[i];
    if (!job.done.load(std::memory_order_acquire)) {
      ++i;
      continue;
    }
    job.thread.join();
    Pool* pool = st_.catalog.find_pool(job.pool_id);
    Status st = job.result;
    if (st && !pool) st = Status(Code::kNotFound, "pool '" + job.pool.name + "' was dropped during its snapshot");
    std::vector<std::byte> reply;
    if (st) {
      append(SnapshotDurable{job.pool_id, job.snapshot_id, job.dir, job.bytes});
      st = commit();  // durable in the journal before the caller hears so
      if (st) {
        // Older snapshots of the pool go once this one is durable.
        std::vector<std::pair<uint64_t, std::string>> old;
        if (auto it = image_.pools().find(job.pool_id); it != image_.pools().end())
          for (const auto& [sid, s] : it->second.snapshots)
            if (sid != job.snapshot_id) old.emplace_back(sid, s.path);
        for (const auto& [sid, path] : old) {
          append(SnapshotDropped{job.pool_id, sid});
          std::error_code ec;
          fs::remove_all(path, ec);
        }
        log_info("pool '{}': snapshot {} durable ({}, stall {} us)", job.pool.name, job.snapshot_id,
                 format_size(job.bytes), job.stall_us);
        (void)wire::encode_reply(static_cast<uint16_t>(wire::MsgType::kSnapshot), job.request_id,
                                 Status::ok(), wire::SnapshotRep{job.snapshot_id, job.bytes, job.stall_us},
                                 reply);
      }
    }
    if (!st) {
      log_warn("pool '{}': snapshot {} failed: {}", job.pool.name, job.snapshot_id, st.message());
      if (pool) append(SnapshotDropped{job.pool_id, job.snapshot_id});
      std::error_code ec;
      fs::remove_all(job.dir, ec);
      (void)wire::encode_reply(static_cast<uint16_t>(wire::MsgType::kSnapshot), job.request_id, st,
                               wire::Empty{}, reply);
    }
    if (sink) sink(job.session_id, reply);
    jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return failed_;
}

Status Durability::restore_pool_from_snapshot(Pool& p, std::vector<Tensor*>& need) {
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
    Arena* a = st_.ram->arena(t->ram->arena_id);
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
