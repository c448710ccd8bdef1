// NvmeTier: opening the engine, shared helpers (RAM extents, fixed-buffer registration, dropping
// RAM copies), restart adoption, forgetting a tensor, the loop's poll and the tier's figures.
#include "tiering/nvme_tier.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/statvfs.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "tiering/admission.hpp"
#include "base/log.hpp"
#include "tiering/internal.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

using tiering::now_s;
using tiering::nvme_bytes;

Result<std::unique_ptr<NvmeTier>> NvmeTier::open(const Config& cfg, Catalog& catalog, RamTier& ram) {
  nvme::EngineOptions o;
  o.hash_threads = cfg.nvme_hash_threads;
  o.flush_behind_bytes = cfg.nvme_flush_behind;
  for (const auto& d : cfg.nvme) {
    nvme::DirConfig dc;
    dc.path = d.path;
    dc.numa_node = d.numa_node;
    if (!cfg.nvme_capacity.empty()) {
      struct statvfs vs{};
      uint64_t free_bytes = 0;
      if (::statvfs(d.path.c_str(), &vs) == 0) free_bytes = uint64_t{vs.f_bavail} * vs.f_frsize;
      auto cap = parse_size(cfg.nvme_capacity, free_bytes);
      if (!cap) return fail(Code::kInvalidArgument, "nvme_capacity: " + cap.error().message());
      dc.capacity = std::max<uint64_t>(*cap, nvme::kExtentAlign);
    }
    o.dirs.push_back(std::move(dc));
  }
  // Files no larger than the capacity: a small tier must not preallocate a whole 1 GiB file.
  if (!cfg.nvme_capacity.empty()) {
    uint64_t smallest = UINT64_MAX;
    for (const auto& d : o.dirs) smallest = std::min(smallest, d.capacity);
    if (smallest < o.file_size)
      o.file_size = (smallest + nvme::kExtentAlign - 1) / nvme::kExtentAlign * nvme::kExtentAlign;
  }
  auto eng = nvme::Engine::open(std::move(o));
  TIER_TRY(eng);
  std::unique_ptr<NvmeTier> m(new NvmeTier(catalog, ram));
  m->engine_ = std::move(*eng);
  m->marks_ = policy::Watermarks{cfg.ram_high_watermark, cfg.ram_low_watermark}.normalized();
  m->dirty_background_ = cfg.ram_dirty_background;
  nvme::EngineStats es = m->engine_->stats();
  auto q = parse_size(cfg.nvme_pool_quota, es.capacity);
  if (!q) return fail(Code::kInvalidArgument, "nvme_pool_quota: " + q.error().message());
  m->default_nvme_quota_ = *q == 0 ? es.capacity : *q;
  m->nvme_capacity_ = es.capacity;
  m->fixed_buffers_ = cfg.prefault;
  m->epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  m->timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (m->epfd_ < 0 || m->timer_fd_ < 0) return fail(Status::from_errno(errno, "NVMe tier: epoll/timerfd"));
  for (int fd : {m->engine_->event_fd(), m->timer_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(m->epfd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return fail(Status::from_errno(errno, "NVMe tier: epoll_ctl"));
  }
  for (const auto& d : es.dirs)
    log_info("NVMe tier: {} ({}{}, {} capacity, NUMA node {})", d.path, d.backend,
             d.direct_io ? " + O_DIRECT" : ", page cache", format_size(d.capacity), d.numa_node);
  log_info("NVMe tier: {} over {} directories; RAM watermarks {:.0f}%/{:.0f}%", format_size(es.capacity),
           es.dirs.size(), m->marks_.high * 100, m->marks_.low * 100);
  return m;
}

NvmeTier::~NvmeTier() {
  if (engine_) engine_->drain();  // callbacks still see the catalog and RAM tier
  engine_.reset();
  if (timer_fd_ >= 0) ::close(timer_fd_);
  if (epfd_ >= 0) ::close(epfd_);
}

NvmeTier::TensorIo& NvmeTier::ts(uint64_t id) {
  auto [it, fresh] = ts_.try_emplace(id);
  if (fresh) it->second.last_use = tick_++;  // first seen: just created, so recently used
  return it->second;
}

std::byte* NvmeTier::ram_ptr(const RamLocation& loc) {
  Arena* a = ram_.arena(loc.arena_id);
  return a ? a->base() + loc.offset : nullptr;
}

uint64_t NvmeTier::nvme_quota(const Pool& p) const {
  return p.nvme_quota == 0 ? default_nvme_quota_ : p.nvme_quota;
}

Status NvmeTier::nvme_admits(const Pool& p, uint64_t size, std::string_view name) const {
  auto need = round_up_checked(size, nvme::kExtentAlign);
  auto refuse = [&](const std::string& what, uint64_t limit) {
    return Status(Code::kResourceExhausted, "tensor '" + std::string(name) + "' of " + format_size(size) +
                                                " can never be leased: it is larger than " + what + " of " +
                                                format_size(limit) +
                                                ", where it must fit to leave RAM when leases need the room");
  };
  if (!need || *need > nvme_quota(p)) return refuse("pool '" + p.name + "''s NVMe quota", nvme_quota(p));
  if (*need > nvme_capacity_) return refuse("the NVMe tier", nvme_capacity_);
  return Status::ok();
}

bool NvmeTier::needs_writeback(const Tensor& t) const {
  if (!t.dirty && t.nvme) return false;
  auto it = ts_.find(t.id);
  return it == ts_.end() || !it->second.dead;
}

const NodeUsage* NvmeTier::node_usage(int32_t node) const {
  for (const auto& n : ram_.nodes())
    if (n.node == node) return &n;
  return nullptr;
}

bool NvmeTier::evictable(const Tensor& t) const {
  if (!t.ram || t.readers > 0 || t.writer || pinned_.contains(t.id) || leasing_.contains(t.id)) return false;
  auto it = ts_.find(t.id);
  return it == ts_.end() || it->second.io == Io::kNone;
}

void NvmeTier::release_ram(Pool& pool, const RamLocation& loc, bool punch) {
  // The RAM tier punches the freed pages no DMA pin covers (daemon/tiering/ram/ram_tier.hpp). Not when
  // the extent is about to be reused in the same arena (keep_pages): the pages would be
  // faulted back in and zeroed by the kernel only to be overwritten; and never for io_uring
  // fixed buffers, whose pages the kernel holds.
  ram_.release(pool, loc, punch && !fixed_buffers_);
}

void NvmeTier::ensure_registration() {
  if (!fixed_buffers_ || ram_.arena_generation() == registered_generation_) return;
  // Registration replaces the whole set, which the kernel allows only with nothing in flight.
  while (engine_->pending() > 0) engine_->wait();
  std::vector<nvme::MemRegion> regions;
  for (auto [base, size] : ram_.arena_spans()) regions.push_back({base, size});
  bool ok = engine_->register_memory(regions);
  registered_generation_ = ram_.arena_generation();
  log_debug("NVMe tier: {} arena(s) {} as io_uring fixed buffers", regions.size(),
            ok ? "registered" : "not all registered");
}

bool NvmeTier::take_keep_pages(uint64_t id) {
  auto it = ts_.find(id);
  if (it == ts_.end()) return false;
  return std::exchange(it->second.keep_pages, false);
}

void NvmeTier::drop_ram_many(std::span<Tensor* const> tensors) {
  if (tensors.empty()) return;
  struct Gone {
    Pool* pool;
    RamLocation loc;
    bool punch;
  };
  std::vector<Gone> gone;
  gone.reserve(tensors.size());
  for (Tensor* t : tensors) {
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p || !t->ram) continue;
    gone.push_back({p, *t->ram, !take_keep_pages(t->id)});
    t->ram.reset();
    if (auto it = ts_.find(t->id); it != ts_.end()) it->second.dead = false;
    if (durable_) durable_->ram_dropped(*t);
  }
  stats_.evictions += gone.size();
  // Write-ahead: the journal must say the RAM copies are gone before their bytes are destroyed
  // (punching first left a window in which a kill -9 replayed a RAM placement over zeroed or
  // reused pages). A failed commit is fatal for the daemon (it stops acknowledging); the
  // extents then stay allocated, so nothing the journal still points at is overwritten.
  if (durable_) {
    if (Status st = durable_->commit(); !st.is_ok()) {
      log_error("journal commit before dropping {} tensors from RAM failed: {}", gone.size(), st.to_string());
      return;
    }
  }
  for (const Gone& g : gone) release_ram(*g.pool, g.loc, g.punch);
}

void NvmeTier::flush_drops() {
  if (pending_drops_.empty()) return;
  std::vector<Tensor*> drop;
  for (uint64_t id : pending_drops_) {
    Tensor* t = catalog_.find_tensor(id);
    if (t && t->ram && !t->dirty && evictable(*t)) drop.push_back(t);
  }
  pending_drops_.clear();
  drop_ram_many(drop);
}

Status NvmeTier::adopt_catalog() {
  for (const auto& [name, pid] : catalog_.pool_names()) {
    Pool* p = catalog_.find_pool(pid);
    if (!p) continue;
    for (auto& [id, t] : p->tensors) {
      if (!t.nvme) continue;
      if (Status st = engine_->adopt(*t.nvme); !st) {
        log_error("tensor '{}' (pool '{}'): its journaled NVMe copy is unusable: {}", t.name, p->name,
                  st.message());
        if (durable_) durable_->nvme_copy_dropped(t);
        t.nvme.reset();
        continue;
      }
      p->nvme_used += nvme_bytes(*t.nvme);
      t.dirty = false;
    }
  }
  return Status::ok();
}

void NvmeTier::forget(Pool& pool, Tensor& t) {
  wait_idle(t.id);
  auto it = ts_.find(t.id);
  if (it != ts_.end() && it->second.drop_after && it->second.io == Io::kSpill && t.ram)
    writeback_pending_bytes_ -= std::min(writeback_pending_bytes_, t.ram->length);
  ts_.erase(t.id);
  pinned_.erase(t.id);
  if (t.nvme) {
    if (Status st = engine_->free(*t.nvme); !st)
      log_warn("freeing the NVMe copy of '{}': {}", t.name, st.message());
    pool.nvme_used -= std::min(pool.nvme_used, nvme_bytes(*t.nvme));
    t.nvme.reset();
    nvme_freed_at_ = now_s();  // write-backs refused for space may be retried at once
  }
}

bool NvmeTier::poll() {
  uint64_t x;
  while (::read(timer_fd_, &x, sizeof x) == sizeof x) {}
  engine_->poll();
  flush_drops();
  ensure_registration();  // promptly unpins the pages of arenas that were unmapped
  if (progress_ || now_s() >= next_prefetch_) {
    maintain();
    if (!plans_.empty()) schedule_prefetch();
  }
  clean_ahead();  // after every request too: a release may have left new dirty bytes
  bool p = progress_;
  progress_ = false;
  return p;
}

NvmeTier::Figures NvmeTier::figures() const {
  Figures f;
  nvme::EngineStats es = engine_->stats();
  for (const auto& d : es.dirs) f.dirs.push_back({d.path, d.numa_node, d.backend, d.capacity, d.used});
  for (const auto& [name, pid] : catalog_.pool_names()) {
    const Pool* p = const_cast<Catalog&>(catalog_).find_pool(pid);
    if (!p) continue;
    for (const auto& [id, t] : p->tensors)
      if (t.ram && needs_writeback(t)) f.dirty_by_node[t.ram->node] += t.ram->length;
  }
  f.bytes_read = es.fetch_bytes;
  f.bytes_written = es.spill_bytes;
  return f;
}

}  // namespace tier::daemon
