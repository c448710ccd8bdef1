#include "nvme/engine.hpp"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/log.hpp"
#include "base/errors.hpp"

namespace tier::nvme {
namespace {

struct AlignedFree {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using Bounce = std::unique_ptr<std::byte, AlignedFree>;

Bounce alloc_bounce(uint64_t n) {
  return Bounce(static_cast<std::byte*>(std::aligned_alloc(kExtentAlign, n)));
}

double mono_seconds() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

bool is_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kExtentAlign == 0; }

// Whether the filesystem under `dir` accepts O_DIRECT opens and I/O. kOk + false with `why`
// when it refuses (EINVAL); an error Status when the directory is unusable.
Result<bool> probe_direct_io(const std::string& dir, std::string& why) {
  std::string p = dir + "/.tier-odirect-probe";
  int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    if (err == EINVAL) {
      why = "the filesystem refuses O_DIRECT (open: EINVAL)";
      return false;
    }
    if (err == EROFS) {  // ProtectSystem=strict mounts all but ReadWritePaths= read-only
      Status e = Status::from_errno(err, "open " + p);
      return fail(Status(e.code(), e.message() + "; under systemd, list " + dir +
                                       " in ReadWritePaths= (tierd-generator does so for the nvme paths"
                                       " of /etc/tierd/tierd.toml at daemon-reload)"));
    }
    return fail(Status::from_errno(err, "open " + p));
  }
  Bounce b = alloc_bounce(kExtentAlign);
  std::memset(b.get(), 0, kExtentAlign);
  ssize_t n = ::pwrite(fd, b.get(), kExtentAlign, 0);
  int err = errno;
  ::close(fd);
  ::unlink(p.c_str());
  if (n != static_cast<ssize_t>(kExtentAlign)) {
    if (n < 0 && err == EINVAL) {
      why = "the filesystem refuses O_DIRECT I/O (write: EINVAL)";
      return false;
    }
    return fail(Status::from_errno(n < 0 ? err : EIO, "probe write " + p));
  }
  return true;
}

WrapBackend& default_wrap_backend() {
  static WrapBackend wrap;
  return wrap;
}

}  // namespace

void set_default_wrap_backend(WrapBackend wrap) { default_wrap_backend() = std::move(wrap); }

struct Engine::Op {
  bool write = false;
  bool submitting = false;  // spill()/fetch() is still issuing: completion must wait
  bool syncing = false;     // a spill whose writes and hashes are done, waiting for fdatasync
  uint64_t tensor_id = 0;
  std::byte* base = nullptr;
  NvmeLocation loc;
  bool has_replaces = false;
  NvmeLocation replaces;
  struct Chunk {
    uint64_t pos = 0;  // offset inside the extent
    uint64_t len = 0;  // tensor bytes in this chunk
    Bounce bounce;     // aligned staging copy (io length = len rounded up), or null
    bool done = false;
  };
  struct Part {        // one extent
    uint64_t pos = 0;  // offset of the extent's bytes in the tensor
    std::vector<Chunk> chunks;
    uint32_t pending = 0;  // chunks in flight
    bool failed = false;
  };
  std::vector<Part> parts;
  size_t outstanding = 0;
  Status error;
  SpillDone spill_done;
  FetchDone fetch_done;
};

Result<std::unique_ptr<Engine>> Engine::open(EngineOptions o) {
  if (o.dirs.empty()) return fail(Code::kInvalidArgument, "no NVMe directory given");
  if (o.dirs.size() > UINT16_MAX) return fail(Code::kInvalidArgument, "too many NVMe directories");
  std::unique_ptr<Engine> e(new Engine());
  e->opts_ = o;
  e->epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  e->efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e->epfd_ < 0 || e->efd_ < 0) return fail(Status::from_errno(errno, "engine epoll/eventfd"));
  auto watch = [&](int fd) -> Status {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(e->epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return Status::from_errno(errno, "epoll_ctl");
    return Status::ok();
  };
  TIER_TRY(watch(e->efd_));

  std::vector<std::unique_ptr<DirStore>> stores;
  for (size_t i = 0; i < o.dirs.size(); ++i) {
    DirConfig dc = o.dirs[i];
    std::error_code ec;
    std::filesystem::create_directories(dc.path, ec);
    if (ec) return fail(Code::kIo, fmt::format("create NVMe directory {}: {}", dc.path, ec.message()));
    if (dc.numa_node < 0) dc.numa_node = detect_numa_node(dc.path);

    std::string why;
    bool direct = false;
    if (is_memory_filesystem(dc.path)) {
      why = "it is on tmpfs/ramfs (no block device; O_DIRECT is refused or meaningless there)";
    } else {
      auto probed = probe_direct_io(dc.path, why);
      TIER_TRY(probed);
      direct = *probed;
    }
    BackendOptions bo{o.queue_depth, o.threads, dc.numa_node};
    std::unique_ptr<IoBackend> backend;
    bool want_uring = o.backend == BackendChoice::kUring || (o.backend == BackendChoice::kAuto && direct);
    if (want_uring) {
      auto u = make_uring_backend(bo);
      if (u) backend = std::move(*u);
      else if (o.backend == BackendChoice::kUring) return fail(u.error());
      else why = u.error().message();
    } else if (o.backend == BackendChoice::kPread) {
      why = "the pread backend was requested";
    }
    if (!backend) {
      auto t = make_thread_pool_backend(bo);
      TIER_TRY(t);
      backend = std::move(*t);
      log_warn(
          "nvme: NVMe directory {}: using the pread/pwrite thread pool ({} threads{}) "
          "because {}",
          dc.path, o.threads, direct ? ", O_DIRECT" : ", page cache", why);
    } else {
      log_info(
          "nvme: NVMe directory {}: io_uring{}, queue depth {}, request size {} KiB, "
          "NUMA node {}",
          dc.path, direct ? " + O_DIRECT" : " (buffered)", o.queue_depth, o.request_size / 1024,
          dc.numa_node);
    }
    const WrapBackend& wrap = o.wrap_backend ? o.wrap_backend : default_wrap_backend();
    if (wrap) backend = wrap(static_cast<uint16_t>(i), std::move(backend));
    Dir d;
    d.direct = direct;
    d.queue = std::make_unique<IoQueue>(std::move(backend), IoQueueOptions{o.request_size, 1000});
    TIER_TRY(watch(d.queue->event_fd()));
    IoQueue* q = d.queue.get();
    e->dirs_.push_back(std::move(d));
    auto st = DirStore::open(static_cast<uint16_t>(i), dc, o.file_size, o.format, direct, o.prepare_files,
                             [q](int fd) { return q->backend().add_file(fd); });
    TIER_TRY(st);
    stores.push_back(std::move(*st));
  }
  e->store_ = std::make_unique<ExtentStore>(std::move(stores), o.stripe_unit, o.max_extent);
  e->hasher_ = std::make_unique<HashPool>(o.hash_threads, e->efd_);
  return e;
}

Engine::~Engine() {
  drain();
  hasher_.reset();
  dirs_.clear();  // queues drain and backends stop before the data files close
  store_.reset();
  if (epfd_ >= 0) ::close(epfd_);
  if (efd_ >= 0) ::close(efd_);
}

bool Engine::register_memory(std::span<const MemRegion> regions) {
  bool all = true;
  for (Dir& d : dirs_) {
    if (d.queue->backend().name().find("io_uring") == std::string_view::npos) continue;
    d.registered = d.queue->backend().register_memory(regions);
    all = all && d.registered;
  }
  return all;
}

void Engine::defer(std::function<void()> fn) {
  ready_.push_back(std::move(fn));
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof one);
}

void Engine::mark_busy(bool busy) {
  if (busy) busy_since_ = mono_seconds();
  else counters_.busy_s += mono_seconds() - busy_since_;
  store_->set_busy(busy);
}

void Engine::signal_if_ready() {
  if (ready_.empty()) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof one);
}

void Engine::start_extent_io(uint64_t op_id, size_t ext, std::byte* base, bool write) {
  Op& op = *ops_.at(op_id);
  Extent& e = op.loc.extents[ext];
  Op::Part& part = op.parts[ext];
  Dir& d = dirs_[e.dir];
  int file = store_->dir(e.dir).backend_file(e.file);
  IoOp kind = write ? IoOp::kWrite : IoOp::kRead;
  uint64_t rs = d.queue->request_size();
  size_t n = static_cast<size_t>((e.length + rs - 1) / rs);
  part.chunks.resize(n);
  if (write) hash_extent(op_id, ext);  // the source is stable until the spill completes
  for (size_t i = 0; i < n; ++i) {
    Op::Chunk& c = part.chunks[i];
    c.pos = i * rs;
    c.len = std::min<uint64_t>(rs, e.length - c.pos);
    std::byte* data = base + c.pos;
    uint64_t io_len = c.len;
    std::byte* io_buf = data;
    // O_DIRECT needs aligned memory and length; anything else is staged in a bounce buffer.
    if (d.direct && (!is_aligned(data) || c.len % kExtentAlign != 0)) {
      io_len = (c.len + kExtentAlign - 1) & ~(kExtentAlign - 1);
      c.bounce = alloc_bounce(io_len);
      io_buf = c.bounce.get();
      if (io_buf == nullptr) {  // the op fails once what was issued has finished
        part.failed = true;
        if (op.error.is_ok())
          op.error = Status(Code::kResourceExhausted, "no memory for an O_DIRECT bounce buffer");
        continue;
      }
      if (write) {
        std::memcpy(io_buf, data, c.len);
        std::memset(io_buf + c.len, 0, io_len - c.len);
      }
    }
    ++part.pending;
    ++op.outstanding;
    d.queue->submit(kind, file, e.offset + c.pos, io_buf, io_len,
                    [this, op_id, ext, i](int64_t r) { io_done(op_id, ext, i, r); });
  }
}

// Tags carry (op, extent); an op never has 2^24 extents (16 M x 4 KiB at the very least).
constexpr int kTagExtentBits = 24;

void Engine::hash_extent(uint64_t op_id, size_t ext) {
  Op& op = *ops_.at(op_id);
  ++op.outstanding;
  hasher_->submit((op_id << kTagExtentBits) | ext, op.base + op.parts[ext].pos, op.loc.extents[ext].length);
}

void Engine::hash_done(uint64_t tag, uint64_t hash) {
  uint64_t op_id = tag >> kTagExtentBits;
  size_t ext = tag & ((uint64_t{1} << kTagExtentBits) - 1);
  Op& op = *ops_.at(op_id);
  Extent& e = op.loc.extents[ext];
  if (op.write) {
    e.checksum = hash;
  } else if (hash != e.checksum) {
    ++counters_.checksum_failures;
    std::string msg =
        fmt::format("checksum mismatch in {} at offset {}", store_->dir(e.dir).file_path(e.file), e.offset);
    log_error("nvme: {} ({} bytes)", msg, e.length);
    if (op.error.is_ok() || op.error.code() != Code::kCorruption)
      op.error = Status(Code::kCorruption, std::move(msg));
  }
  --op.outstanding;
  if (op.outstanding == 0 && !op.submitting) settle(op_id);
}

void Engine::spill(uint64_t tensor_id, std::span<const std::byte> src, SpillDone done,
                   const NvmeLocation* replaces) {
  auto extents = store_->allocate(src.size());
  if (!extents) {
    Status s(extents.error().code(), fmt::format("spill of tensor {} ({} bytes): {}", tensor_id, src.size(),
                                                 extents.error().message()));
    defer([done = std::move(done), s] { done(fail(s)); });
    return;
  }
  uint64_t id = next_op_++;
  auto op = std::make_unique<Op>();
  op->write = true;
  op->submitting = true;
  op->tensor_id = tensor_id;
  op->base = const_cast<std::byte*>(src.data());  // only read: the op is a write
  op->loc.size = src.size();
  op->loc.extents = std::move(*extents);
  if (replaces) {
    op->has_replaces = true;
    op->replaces = *replaces;
  }
  op->spill_done = std::move(done);
  op->parts.resize(op->loc.extents.size());
  uint64_t pos = 0;
  for (size_t i = 0; i < op->loc.extents.size(); ++i) {
    op->parts[i].pos = pos;
    pos += op->loc.extents[i].length;
  }
  Op* raw = op.get();
  if (ops_.empty()) mark_busy(true);
  ops_.emplace(id, std::move(op));
  ++counters_.spills;
  for (size_t i = 0; i < raw->loc.extents.size(); ++i)
    start_extent_io(id, i, raw->base + raw->parts[i].pos, true);
  raw->submitting = false;
  if (raw->outstanding == 0) settle(id);
  issue_syncs();
  signal_if_ready();
}

void Engine::fetch(const NvmeLocation& loc, std::span<std::byte> dst, FetchDone done) {
  uint64_t total = 0;
  for (const Extent& e : loc.extents) {
    if (e.dir >= store_->dirs() || e.file >= store_->dir(e.dir).files() || !well_formed(loc)) {
      defer([done = std::move(done)] {
        done(Status(Code::kInvalidArgument,
                    "fetch: malformed location or one naming a data file that does not exist"));
      });
      return;
    }
    total += e.length;
  }
  if (total != loc.size || dst.size() != loc.size) {
    Status s(Code::kInvalidArgument,
             fmt::format("fetch: destination holds {} bytes, location {} (extents add up to {})", dst.size(),
                         loc.size, total));
    defer([done = std::move(done), s] { done(s); });
    return;
  }
  uint64_t id = next_op_++;
  auto op = std::make_unique<Op>();
  op->submitting = true;
  op->base = dst.data();
  op->loc = loc;
  op->fetch_done = std::move(done);
  op->parts.resize(loc.extents.size());
  uint64_t pos = 0;
  for (size_t i = 0; i < loc.extents.size(); ++i) {
    op->parts[i].pos = pos;
    pos += loc.extents[i].length;
  }
  Op* raw = op.get();
  if (ops_.empty()) mark_busy(true);
  ops_.emplace(id, std::move(op));
  ++counters_.fetches;
  for (size_t i = 0; i < raw->loc.extents.size(); ++i)
    start_extent_io(id, i, raw->base + raw->parts[i].pos, false);
  raw->submitting = false;
  if (raw->outstanding == 0) settle(id);
  signal_if_ready();
}

void Engine::io_done(uint64_t op_id, size_t ext, size_t chunk, int64_t result) {
  Op& op = *ops_.at(op_id);
  Op::Part& part = op.parts[ext];
  const Extent& e = op.loc.extents[ext];
  Op::Chunk& c = part.chunks[chunk];
  if (result < 0) {
    part.failed = true;
    ++counters_.io_errors;
    if (op.error.is_ok())
      op.error = Status::from_errno(static_cast<int>(-result),
                                    fmt::format("{} {} at offset {}", op.write ? "write" : "read",
                                                store_->dir(e.dir).file_path(e.file), e.offset + c.pos));
  } else if (!op.write && !part.failed) {
    if (c.bounce) std::memcpy(op.base + part.pos + c.pos, c.bounce.get(), c.len);
    c.done = true;
  } else if (op.write) {
    note_written(e, static_cast<uint64_t>(result));
  }
  c.bounce.reset();
  --part.pending;
  // The extent's bytes are all in: verify them on a hash worker.
  if (!op.write && part.pending == 0 && !part.failed) hash_extent(op_id, ext);
  --op.outstanding;
  if (op.outstanding == 0 && !op.submitting) settle(op_id);
}

void Engine::settle(uint64_t op_id) {
  Op& op = *ops_.at(op_id);
  if (op.write && op.error.is_ok() && !op.syncing && !op.loc.extents.empty()) start_sync(op_id);
  else finish(op_id);
}

// Group commit. A spill whose writes are done waits for one fdatasync of every data file it
// wrote; each file has at most one sync in flight, and every spill that finished its writes
// meanwhile waits for the next one, so one flush covers all the writes of a batch. Syncs are
// issued from issue_syncs() at the end of poll(), after every completion reaped in it, so the
// spills completing in one poll share a sync even when none is in flight.
void Engine::start_sync(uint64_t op_id) {
  Op& op = *ops_.at(op_id);
  op.syncing = true;
  std::vector<uint64_t> keys;
  for (const Extent& e : op.loc.extents) {
    uint64_t key = sync_key(e);
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    keys.push_back(key);
    FileSync& f = syncs_[key];
    f.waiting.push_back(op_id);
    ++op.outstanding;
    if (!f.in_flight && f.waiting.size() == 1) sync_due_.push_back(key);
  }
}

// Write-behind flush (EngineOptions::flush_behind_bytes): a file that has taken that many
// bytes of writes since its last sync was issued gets one with no spill waiting on it. Spills
// still wait only for a sync issued after their writes completed (start_sync), so durability is
// unchanged; what changes is how much the device has left to persist when that sync comes.
void Engine::note_written(const Extent& e, uint64_t bytes) {
  uint64_t key = sync_key(e);
  FileSync& f = syncs_[key];
  f.unsynced += bytes;
  if (behind_due(f) && !f.in_flight && f.waiting.empty()) sync_due_.push_back(key);
}

bool Engine::behind_due(const FileSync& f) const {
  return opts_.flush_behind_bytes > 0 && f.unsynced >= opts_.flush_behind_bytes;
}

void Engine::issue_syncs() {
  auto due = std::move(sync_due_);
  sync_due_.clear();
  for (uint64_t key : due) {
    FileSync& f = syncs_[key];
    if (f.in_flight) continue;
    if (f.waiting.empty() && !behind_due(f)) continue;
    if (f.waiting.empty()) ++counters_.behind_syncs;
    f.covered = std::move(f.waiting);
    f.waiting.clear();
    f.unsynced = 0;
    f.in_flight = true;
    auto dir = static_cast<uint16_t>(key >> 32);
    auto file = static_cast<uint32_t>(key & 0xffffffffu);
    dirs_[dir].queue->submit(IoOp::kSync, store_->dir(dir).backend_file(file), 0, nullptr, 0,
                             [this, key](int64_t r) { sync_done(key, r); });
  }
}

void Engine::sync_done(uint64_t key, int64_t result) {
  FileSync& f = syncs_[key];
  f.in_flight = false;
  std::vector<uint64_t> done = std::move(f.covered);
  f.covered.clear();
  Status err;
  if (result < 0) {
    ++counters_.io_errors;
    auto dir = static_cast<uint16_t>(key >> 32);
    auto file = static_cast<uint32_t>(key & 0xffffffffu);
    err = Status::from_errno(static_cast<int>(-result),
                             fmt::format("fdatasync {}", store_->dir(dir).file_path(file)));
    log_error("nvme: {}", err.message());
    // Any write to the file that completed before or while the failed sync ran may have been
    // written back by it, its error consumed by it: a later sync could report success for bytes
    // that never landed. So every spill with writes to the file fails, not only those the sync
    // covered: the waiting ones, and those still writing (a write-behind sync covers no spill).
    done.insert(done.end(), f.waiting.begin(), f.waiting.end());
    f.waiting.clear();
    for (auto& [id, op] : ops_) {
      if (!op->write || !op->error.is_ok()) continue;
      for (const Extent& e : op->loc.extents)
        if (sync_key(e) == key) {
          op->error = err;
          break;
        }
    }
  } else if (!f.waiting.empty() || behind_due(f)) {
    sync_due_.push_back(key);
  }
  for (uint64_t op_id : done) {
    Op& op = *ops_.at(op_id);
    if (!err.is_ok() && op.error.is_ok()) op.error = err;
    if (--op.outstanding == 0) finish(op_id);
  }
}

void Engine::finish(uint64_t op_id) {
  auto node = ops_.extract(op_id);
  if (ops_.empty()) mark_busy(false);
  std::unique_ptr<Op> op = std::move(node.mapped());
  if (op->write) {
    if (!op->error.is_ok()) {
      if (Status s = store_->release(op->loc.extents); !s)
        log_error("nvme: freeing extents of a failed spill: {}", s.to_string());
      Status err(op->error.code(), fmt::format("spill of tensor {}: {}", op->tensor_id, op->error.message()));
      ready_.push_back([done = std::move(op->spill_done), err] { done(fail(err)); });
      return;
    }
    if (op->has_replaces) {
      if (Status s = store_->release(op->replaces.extents); !s)
        log_error("nvme: freeing the replaced copy of tensor {}: {}", op->tensor_id, s.to_string());
    }
    counters_.spill_bytes += op->loc.size;
    ready_.push_back(
        [done = std::move(op->spill_done), loc = std::move(op->loc)]() mutable { done(std::move(loc)); });
  } else {
    if (op->error.is_ok()) counters_.fetch_bytes += op->loc.size;
    ready_.push_back([done = std::move(op->fetch_done), st = op->error] { done(st); });
  }
}

Status Engine::free(const NvmeLocation& loc) { return store_->release(loc.extents); }
Status Engine::adopt(const NvmeLocation& loc) {
  if (!well_formed(loc)) return {Code::kInvalidArgument, "adopt: malformed NVMe location"};
  return store_->reserve(loc.extents);
}

size_t Engine::poll() {
  uint64_t v;
  while (::read(efd_, &v, sizeof v) == sizeof v) {}
  for (Dir& d : dirs_) d.queue->poll();
  hashed_.clear();
  hasher_->take(hashed_);
  for (const HashPool::Result& r : hashed_) hash_done(r.tag, r.hash);
  issue_syncs();
  size_t n = 0;
  while (!ready_.empty()) {
    auto batch = std::move(ready_);
    ready_.clear();
    for (auto& fn : batch) {
      fn();
      ++n;
    }
  }
  return n;
}

void Engine::wait() {
  if (poll() > 0) return;
  while (!ops_.empty() || !ready_.empty()) {
    wait_readable(epfd_, 1000);
    if (poll() > 0) return;
  }
}

void Engine::drain() {
  while (!ops_.empty() || !ready_.empty()) wait();
}

double Engine::measured_bandwidth() const {
  double busy = counters_.busy_s;
  if (!ops_.empty()) busy += mono_seconds() - busy_since_;
  uint64_t bytes = counters_.spill_bytes + counters_.fetch_bytes;
  return busy > 0 ? static_cast<double>(bytes) / busy : 0;
}

EngineStats Engine::stats() const {
  EngineStats s = counters_;
  s.dirs.clear();
  for (size_t i = 0; i < dirs_.size(); ++i) {
    const DirStore& ds = store_->dir(i);
    const IoQueue& q = *dirs_[i].queue;
    DirStats d;
    d.path = ds.path();
    d.numa_node = ds.numa_node();
    d.backend = std::string(q.backend().name());
    d.direct_io = dirs_[i].direct;
    d.registered_buffers = dirs_[i].registered;
    d.capacity = ds.capacity();
    d.used = ds.used();
    d.file_bytes = ds.file_bytes();
    d.bytes_read = q.counters().bytes_read;
    d.bytes_written = q.counters().bytes_written;
    d.syncs = q.counters().syncs;
    d.prepared_bytes = ds.prepared_bytes();
    d.requests = q.counters().requests;
    d.short_retries = q.counters().short_retries;
    d.eagain_retries = q.counters().eagain_retries;
    d.in_flight = q.backend().in_flight();
    d.queue_depth = q.backend().queue_depth();
    d.request_size = q.request_size();
    s.capacity += d.capacity;
    s.used += d.used;
    s.dirs.push_back(std::move(d));
  }
  return s;
}

}  // namespace tier::nvme
