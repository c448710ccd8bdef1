#include "daemon/tiering.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/statvfs.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "daemon/admission.hpp"
#include "daemon/durability.hpp"
#include "daemon/log.hpp"
#include "policy/prefetch.hpp"

namespace tier::daemon {

namespace {

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

uint64_t nvme_bytes(const nvme::NvmeLocation& loc) {
  uint64_t b = 0;
  for (const auto& e : loc.extents) b += nvme::allocated_bytes(e);
  return b;
}

// The share of RAM a plan keeps resident when its client gives no budget.
constexpr double kDefaultPlanBudget = 0.5;
// A failed write-back (tier full, quota, device error) is not retried for this long, so an
// allocation that cannot evict fails instead of retrying the same victim forever (space
// refusals end earlier: TierManager::spill_backed_off).
constexpr double kSpillRetryS = 1.0;
// Prefetch lead time beyond the transfer time, as a fraction of it (the device is shared with
// checksum work and other clients).
constexpr double kPrefetchMargin = 0.3;

}  // namespace

Result<std::unique_ptr<TierManager>> TierManager::open(const Config& cfg, Catalog& catalog,
                                                       RamTier& ram) {
  nvme::EngineOptions o;
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
    if (smallest < o.file_size) o.file_size = (smallest + nvme::kExtentAlign - 1) / nvme::kExtentAlign * nvme::kExtentAlign;
  }
  auto eng = nvme::Engine::open(std::move(o));
  if (!eng) return fail(eng.error());
  std::unique_ptr<TierManager> m(new TierManager(catalog, ram));
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
  log_info("NVMe tier: {} over {} directories; RAM watermarks {:.0f}%/{:.0f}%",
           format_size(es.capacity), es.dirs.size(), m->marks_.high * 100, m->marks_.low * 100);
  return m;
}

TierManager::~TierManager() {
  if (engine_) engine_->drain();  // callbacks still see the catalog and RAM tier
  engine_.reset();
  if (timer_fd_ >= 0) ::close(timer_fd_);
  if (epfd_ >= 0) ::close(epfd_);
}

TierManager::TState& TierManager::ts(uint64_t id) {
  auto [it, fresh] = ts_.try_emplace(id);
  if (fresh) it->second.last_use = tick_++;  // first seen: just created, so recently used
  return it->second;
}

std::byte* TierManager::ram_ptr(const RamLocation& loc) {
  Arena* a = ram_.arena(loc.arena_id);
  return a ? a->base() + loc.offset : nullptr;
}

uint64_t TierManager::nvme_quota(const Pool& p) const {
  return p.nvme_quota == 0 ? default_nvme_quota_ : p.nvme_quota;
}

Status TierManager::nvme_admits(const Pool& p, uint64_t size, std::string_view name) const {
  auto need = round_up_checked(size, nvme::kExtentAlign);
  auto refuse = [&](const std::string& what, uint64_t limit) {
    return Status(Code::kResourceExhausted,
                  "tensor '" + std::string(name) + "' of " + format_size(size) +
                      " can never be leased: it is larger than " + what + " of " + format_size(limit) +
                      ", where it must fit to leave RAM when leases need the room");
  };
  if (!need || *need > nvme_quota(p)) return refuse("pool '" + p.name + "''s NVMe quota", nvme_quota(p));
  if (*need > nvme_capacity_) return refuse("the NVMe tier", nvme_capacity_);
  return Status::ok();
}

bool TierManager::spill_backed_off(const TState& s, double now) const {
  if (now - s.spill_failed_at >= kSpillRetryS) return false;
  return !(s.spill_error.code() == Code::kResourceExhausted && nvme_freed_at_ >= s.spill_failed_at);
}

std::string TierManager::nvme_short_message(const NvmeShort& sh) const {
  if (const Pool* p = sh.quota_pool) {
    const uint64_t q = nvme_quota(*p);
    return fmt::format("pool '{}' NVMe quota full: {} of {} free, {} needed for the victims' write-backs", p->name,
                       format_size(q - std::min(q, p->nvme_used)), format_size(q), format_size(sh.bytes));
  }
  const nvme::EngineStats es = engine_->stats();
  return fmt::format("NVMe tier full: {} free, {} needed for the victims' write-backs",
                     format_size(es.capacity - std::min(es.capacity, es.used)), format_size(sh.bytes));
}

bool TierManager::needs_writeback(const Tensor& t) const {
  if (!t.dirty && t.nvme) return false;
  auto it = ts_.find(t.id);
  return it == ts_.end() || !it->second.dead;
}

const NodeUsage* TierManager::node_usage(int32_t node) const {
  for (const auto& n : ram_.nodes())
    if (n.node == node) return &n;
  return nullptr;
}

bool TierManager::evictable(const Tensor& t) const {
  if (!t.ram || t.readers > 0 || t.writer || pinned_.contains(t.id) || leasing_.contains(t.id)) return false;
  auto it = ts_.find(t.id);
  return it == ts_.end() || it->second.io == Io::kNone;
}

void TierManager::release_ram(Pool& pool, const RamLocation& loc, bool punch) {
  // Give the pages back: the arena is sparse shared memory and freeing the extent alone would
  // keep them resident. (Clients map the same object; nobody holds a lease on these bytes.)
  // On hugetlbfs only whole huge pages can be punched; a refusal just keeps the pages.
  // Not when the extent is about to be reused in the same arena (keep_pages): the pages would
  // be faulted back in and zeroed by the kernel only to be overwritten.
  // Ranges a client pinned for DMA keep their pages (daemon/dma_pins.hpp): only the rest of
  // the extent is punched.
  if (Arena* a = punch && !fixed_buffers_ ? ram_.arena(loc.arena_id) : nullptr) {
    for (auto [off, len] : dma_pins_.unpinned(loc.arena_id, loc.offset, loc.length))
      if (::fallocate(a->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
                      static_cast<off_t>(len)) != 0)
        log_debug("punching {} bytes at {} of {}: {}", len, off, a->path(), std::strerror(errno));
  }
  ram_.release(pool, loc);
}

void TierManager::ensure_registration() {
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

bool TierManager::take_keep_pages(uint64_t id) {
  auto it = ts_.find(id);
  if (it == ts_.end()) return false;
  return std::exchange(it->second.keep_pages, false);
}

void TierManager::drop_ram_many(std::span<Tensor* const> tensors) {
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

void TierManager::flush_drops() {
  if (pending_drops_.empty()) return;
  std::vector<Tensor*> drop;
  for (uint64_t id : pending_drops_) {
    Tensor* t = catalog_.find_tensor(id);
    if (t && t->ram && !t->dirty && evictable(*t)) drop.push_back(t);
  }
  pending_drops_.clear();
  drop_ram_many(drop);
}

// --- I/O ---

Status TierManager::start_fetch(Pool& pool, Tensor& t, bool demand, std::optional<Ahead> ahead) {
  TState& s = ts(t.id);
  if (t.ram || s.io == Io::kFetch) return Status::ok();
  // In no tier (discarded, then dropped): there is nothing to read ahead; a lease zero-fills.
  if (!t.nvme && !demand) return Status::ok();
  Result<RamLocation> loc = fail(Code::kResourceExhausted, "");
  if (demand) {
    loc = allocate(pool, t.node, t.size);  // kBusy: retried when I/O completes
  } else {
    // Ahead of use: only clean victims used later than this tensor (or in no plan), no waiting;
    // and never into room above the node's high watermark: maintain() would evict the farthest
    // used tensors again, which a wide plan window fetches again at once (a fetch-evict cycle
    // that kept the device busy and starved a lease until it timed out).
    const NodeUsage* nu = node_usage(t.node);
    const bool over_high = nu && policy::bytes_to_evict(nu->used + t.size, nu->capacity, marks_) > 0;
    if (!over_high) loc = ram_.allocate(pool, t.node, t.size);
    if (over_high || (!loc && loc.error().code() == Code::kResourceExhausted)) {
      auto cands = candidates(std::nullopt, t.node, ahead);
      std::erase_if(cands, [&](const policy::Candidate& c) {
        const Tensor* v = catalog_.find_tensor(c.id);
        return !v || needs_writeback(*v) || (pool.ram_used + t.size > pool.ram_quota && v->pool_id != pool.id);
      });
      uint64_t started = 0;
      Status err;
      if (evict_some(cands, t.size, started, err, pool.id, t.node) > 0) loc = ram_.allocate(pool, t.node, t.size);
    }
  }
  if (!loc) return loc.error();
  // ensure_registration() may drain I/O, whose completions run: only after it can nobody else
  // have given this tensor RAM or started its I/O (fetches start only here).
  ensure_registration();
  TState& s2 = ts(t.id);
  if (t.ram || s2.io != Io::kNone) {
    ram_.release(pool, *loc);
    return Status::ok();
  }
  std::byte* dst = ram_ptr(*loc);
  if (!dst) {
    ram_.release(pool, *loc);
    return Status(Code::kInternal, "no arena for a fetch");
  }
  if (!t.nvme) {
    std::memset(dst, 0, t.size);
    t.ram = *loc;
    if (durable_) durable_->ram_placed(t);
    t.dirty = true;
    s2.last_use = tick_++;
    stats_.fetches_skipped++;
    progress_ = true;
    return Status::ok();
  }
  s2.io = Io::kFetch;
  s2.pending = *loc;
  s2.error.reset();
  engine_->fetch(*t.nvme, {dst, t.size}, [this, id = t.id](Status st) { fetch_done(id, std::move(st)); });
  (void)s;
  return Status::ok();
}

void TierManager::fetch_done(uint64_t id, Status st) {
  progress_ = true;
  auto it = ts_.find(id);
  if (it == ts_.end()) return;
  TState& s = it->second;
  s.io = Io::kNone;
  Tensor* t = catalog_.find_tensor(id);
  Pool* p = t ? catalog_.find_pool(t->pool_id) : nullptr;
  if (!t || !p) return;  // forget() waits for I/O, so this does not happen
  if (st) {
    t->ram = s.pending;
    if (durable_) durable_->ram_placed(*t);
    t->dirty = false;
    s.last_use = tick_++;
    stats_.fetches++;
  } else {
    release_ram(*p, s.pending);
    s.error = st;
    stats_.fetch_errors++;
    log_warn("fetch of tensor '{}' (pool '{}') failed: {}", t->name, p->name, st.message());
  }
}

Status TierManager::start_spill(Pool& pool, Tensor& t, bool drop_after) {
  ensure_registration();  // before looking at t: it may drain I/O
  TState& s = ts(t.id);
  if (s.io != Io::kNone || !t.ram) return Status(Code::kBusy, "tensor '" + t.name + "' has I/O in flight");
  uint64_t old = t.nvme ? nvme_bytes(*t.nvme) : 0;
  uint64_t need = (t.size + nvme::kExtentAlign - 1) / nvme::kExtentAlign * nvme::kExtentAlign;
  uint64_t quota = nvme_quota(pool);
  uint64_t& spilling = nvme_spilling_[pool.id];
  if (pool.nvme_used - std::min(pool.nvme_used, old) + spilling + need > quota)
    return Status(Code::kResourceExhausted,
                  "pool '" + pool.name + "' NVMe quota of " + format_size(quota) + " reached (used " +
                      format_size(pool.nvme_used) + ", being written " + format_size(spilling) +
                      ", need " + format_size(need) + ")");
  std::byte* src = ram_ptr(*t.ram);
  if (!src) return Status(Code::kInternal, "no arena for a write-back");
  s.io = Io::kSpill;
  s.spill_gen = s.write_gen;
  s.spill_pool = pool.id;
  s.spill_reserved = need;
  spilling += need;
  s.drop_after = drop_after;
  if (drop_after) writeback_pending_bytes_ += t.ram->length;
  engine_->spill(t.id, {src, t.size},
                 [this, id = t.id](Result<nvme::NvmeLocation> r) { spill_done(id, std::move(r)); },
                 t.nvme ? &*t.nvme : nullptr);
  return Status::ok();
}

void TierManager::spill_done(uint64_t id, Result<nvme::NvmeLocation> r) {
  progress_ = true;
  auto it = ts_.find(id);
  if (it == ts_.end()) return;
  TState& s = it->second;
  s.io = Io::kNone;
  if (auto r = nvme_spilling_.find(s.spill_pool); r != nvme_spilling_.end()) {
    r->second -= std::min(r->second, s.spill_reserved);
    if (r->second == 0) nvme_spilling_.erase(r);
  }
  s.spill_reserved = 0;
  const bool cleaning = std::exchange(s.cleaning, false);
  Tensor* t = catalog_.find_tensor(id);
  Pool* p = t ? catalog_.find_pool(t->pool_id) : nullptr;
  if (!t || !p) return;
  if (s.drop_after && t->ram)
    writeback_pending_bytes_ -= std::min(writeback_pending_bytes_, t->ram->length);
  if (!r) {
    stats_.writeback_errors++;
    s.spill_failed_at = now_s();
    s.spill_error = r.error();
    last_spill_error_ = r.error();
    log_warn("write-back of tensor '{}' (pool '{}') failed: {}", t->name, p->name, r.error().message());
    return;  // the RAM copy (and any older NVMe copy) stay
  }
  uint64_t old = t->nvme ? nvme_bytes(*t->nvme) : 0;
  p->nvme_used = p->nvme_used - std::min(p->nvme_used, old) + nvme_bytes(*r);
  t->nvme = std::move(*r);
  // Journaled only now that the copy is durable (the engine reports a spill after its writes
  // and an fdatasync of each data file they went to), and only when no write lease was granted
  // while it ran (those bytes may be torn); then the replaced copy is recorded as gone.
  if (durable_) {
    if (s.write_gen == s.spill_gen) durable_->nvme_copy_written(*t, *t->nvme);
    else durable_->nvme_copy_dropped(*t);
  }
  stats_.writebacks++;
  if (cleaning) stats_.cleaned_bytes += t->size;
  s.torn_copy = s.write_gen != s.spill_gen;
  if (!s.torn_copy) t->dirty = false;  // no write lease since it started
  if (s.drop_after && !t->dirty && evictable(*t)) pending_drops_.push_back(t->id);  // flush_drops()
}

void TierManager::wait_idle(uint64_t id) {
  for (;;) {
    auto it = ts_.find(id);
    if (it == ts_.end() || it->second.io == Io::kNone || engine_->pending() == 0) return;
    engine_->wait();
    flush_drops();
  }
}

// --- eviction ---

std::vector<policy::PlanAt> TierManager::plans_for_pool(uint64_t pool_id) const {
  std::vector<policy::PlanAt> out;
  for (const auto& [sid, p] : plans_)
    if (p.pool_id == pool_id) out.push_back({&p.index, p.cursor, p.seconds_per_use});
  return out;
}

std::vector<policy::Candidate> TierManager::candidates(std::optional<uint64_t> pool,
                                                       std::optional<int32_t> node,
                                                       std::optional<Ahead> protect) {
  std::vector<policy::Candidate> out;
  // Several clients (a trainer's pass and its optimizer thread, or several ranks on the node)
  // may each have a plan over the pool: a tensor's next use is the nearest in any of them.
  auto add_pool = [&](Pool& p) {
    const std::vector<policy::PlanAt> plans = plans_for_pool(p.id);
    std::optional<uint64_t> limit;
    if (protect)
      limit = policy::distance_key({nullptr, 0, protect->seconds_per_use}, protect->uses,
                                   policy::timed_distances(plans));
    for (auto& [id, t] : p.tensors) {
      if (!evictable(t) || (node && t.ram->node != *node)) continue;
      policy::Candidate c = policy::make_candidate(id, t.ram->length, ts(id).last_use, plans);
      c.dirty = needs_writeback(t);
      if (auto it = ts_.find(id); it != ts_.end()) c.discarded_before = it->second.discarded_before;
      if (limit && c.next_use && *c.next_use <= *limit) continue;
      out.push_back(c);
    }
  };
  if (pool) {
    if (Pool* p = catalog_.find_pool(*pool)) add_pool(*p);
  } else {
    for (const auto& [name, pid] : catalog_.pool_names())
      if (Pool* p = catalog_.find_pool(pid)) add_pool(*p);
  }
  return out;
}

uint64_t TierManager::evict_some(std::span<const policy::Candidate> cands, uint64_t need,
                                 uint64_t& started, Status& last_error,
                                 std::optional<uint64_t> for_pool, int32_t for_node, NvmeShort* short_of) {
  uint64_t freed = 0;
  std::vector<Tensor*> clean;  // dropped together below: one journal commit
  // A victim whose write-back NVMe space refused goes into *short_of, until such victims would
  // have freed `need`: what this allocation lacks.
  auto space_refused = [&](const Tensor& t, const Pool& p, const Status& st) {
    if (!short_of || st.code() != Code::kResourceExhausted || short_of->ram_bytes >= need) return;
    const uint64_t n = round_up_checked(t.size, nvme::kExtentAlign).value_or(t.size);
    short_of->bytes += n;
    short_of->ram_bytes += t.ram->length;
    // The pool's quota, when it is below the tier (a default quota is the whole tier).
    const uint64_t old = t.nvme ? nvme_bytes(*t.nvme) : 0;
    if (nvme_quota(p) < nvme_capacity_ && p.nvme_used - std::min(p.nvme_used, old) + n > nvme_quota(p))
      short_of->quota_pool = &p;
  };
  for (uint64_t id : policy::eviction_order(cands)) {
    if (freed + started >= need) break;
    Tensor* t = catalog_.find_tensor(id);
    Pool* p = t ? catalog_.find_pool(t->pool_id) : nullptr;
    if (!p || !evictable(*t)) continue;
    if (needs_writeback(*t) && spill_backed_off(ts(id), now_s())) {
      last_error = ts(id).spill_error;
      space_refused(*t, *p, last_error);
      continue;
    }
    uint64_t len = t->ram->length;
    ts(id).keep_pages = for_pool && *for_pool == t->pool_id && for_node == t->ram->node;
    if (!needs_writeback(*t)) {
      clean.push_back(t);
      freed += len;
    } else if (Status st = start_spill(*p, *t, true); st) {
      started += len;
    } else {
      last_error = st;
      ts(id).spill_failed_at = now_s();
      ts(id).spill_error = st;
      space_refused(*t, *p, st);
    }
  }
  drop_ram_many(clean);
  return freed;
}

Result<RamLocation> TierManager::allocate(Pool& pool, int32_t node, uint64_t size) {
  // A size no eviction can make room for (a tensor journaled before admission checked it):
  // refused without evicting anything.
  if (Status st = ram_admits(ram_, pool, node, size, ""); !st) return fail(std::move(st));
  Status last_error;
  NvmeShort short_of;
  last_spill_error_ = Status::ok();
  for (;;) {
    auto loc = ram_.allocate(pool, node, size);
    if (loc) {
      maintain();
      return loc;
    }
    if (loc.error().code() != Code::kResourceExhausted) return loc;
    // What limits it: the pool's quota (evict its tensors anywhere), the node (anyone's on the
    // node), else fragmentation of the pool's arena on the node (its tensors there).
    uint64_t gran = 4096;
    uint64_t need = (size + gran - 1) / gran * gran;
    std::optional<uint64_t> in_pool;
    std::optional<int32_t> on_node;
    const NodeUsage* nu = node_usage(node);
    if (pool.ram_used + need > pool.ram_quota) {
      in_pool = pool.id;
    } else if (nu && nu->used + need > nu->capacity) {
      on_node = node;
    } else {
      in_pool = pool.id;
      on_node = node;
    }
    auto cands = candidates(in_pool, on_node, std::nullopt);
    uint64_t started = 0;
    short_of = {};
    uint64_t freed = evict_some(cands, need, started, last_error, pool.id, node, &short_of);
    if (freed > 0) continue;
    if (engine_->pending() > 0) return fail(Code::kBusy, "RAM is being freed by write-backs");
    // Say what is really short: NVMe space for the victims' write-backs, a failing device, or
    // evictable tensors (the rest leased or pinned).
    std::string why = loc.error().message();
    if (last_error.is_ok()) last_error = last_spill_error_;
    if (short_of.bytes > 0) why += "; " + nvme_short_message(short_of);
    else if (!last_error.is_ok()) why += "; writing back its victims failed: " + last_error.message();
    else why += "; nothing more can be evicted (the rest is leased or pinned by waiting leases)";
    return fail(Code::kResourceExhausted, why);
  }
}

void TierManager::maintain() {
  for (const auto& n : ram_.nodes()) {
    uint64_t over = policy::bytes_to_evict(n.used, n.capacity, marks_);
    if (over <= writeback_pending_bytes_) continue;
    auto cands = candidates(std::nullopt, n.node, std::nullopt);
    uint64_t started = writeback_pending_bytes_;
    Status err;
    evict_some(cands, over, started, err);
  }
}

void TierManager::clean_ahead() {
  if (dirty_background_ >= 1.0 || plans_.empty() || engine_->pending() != 0) return;
  // The scan walks every plan (up to max_plan_uses each): after a completion it runs at once
  // (the device just went idle), otherwise at most every 2 ms, so a loop busy with leases
  // spends little on it.
  const double now = now_s();
  if (!progress_ && now < next_clean_scan_) {
    if (!std::isfinite(clean_due_)) {  // look again then, even if nothing else happens
      clean_due_ = next_clean_scan_;
      arm_timer();
    }
    return;
  }
  next_clean_scan_ = now + 0.002;
  clean_due_ = std::numeric_limits<double>::infinity();
  // Only tensors a plan reads later: their bytes are live and must reach NVMe before their RAM
  // can be reused, and the plan says when they are needed. A tensor overwritten next (or in no
  // plan) may never need the write, so it is left to eviction.
  // The limit is a fraction of the node's RAM tier and of the pool's RAM quota, whichever
  // binds: a pool far below the node's capacity still evicts when it reaches its quota.
  std::unordered_map<int32_t, uint64_t> node_dirty;  // planned, live, dirty bytes in RAM
  std::unordered_map<uint64_t, uint64_t> pool_dirty;
  struct Cand {
    Tensor* t;
    Pool* pool;
    uint64_t next;
  };
  std::vector<Cand> cands;
  std::unordered_set<uint64_t> seen;
  for (const auto& [sid, pl] : plans_) {
    Pool* pool = catalog_.find_pool(pl.pool_id);
    if (!pool) continue;
    const std::vector<policy::PlanAt> plans = plans_for_pool(pool->id);
    for (uint64_t id : pl.index.order()) {
      if (!seen.insert(id).second) continue;
      Tensor* t = catalog_.find_tensor(id);
      if (!t || !t->ram || !needs_writeback(*t)) continue;
      policy::Candidate c = policy::make_candidate(id, t->ram->length, 0, plans);
      if (!c.next_use) continue;
      node_dirty[t->ram->node] += t->ram->length;
      pool_dirty[pool->id] += t->ram->length;
      if (evictable(*t) && !spill_backed_off(ts(id), now)) cands.push_back({t, pool, *c.next_use});
    }
  }
  std::unordered_map<int32_t, uint64_t> node_capacity;
  for (const auto& n : ram_.nodes()) node_capacity[n.node] = n.capacity;
  auto over = [&](uint64_t bytes, uint64_t limit) {
    return limit > 0 && static_cast<double>(bytes) > dirty_background_ * static_cast<double>(limit);
  };
  const Cand* pick = nullptr;
  for (const Cand& c : cands)
    if ((over(node_dirty[c.t->ram->node], node_capacity[c.t->ram->node]) ||
         over(pool_dirty[c.pool->id], c.pool->ram_quota)) &&
        (!pick || c.next > pick->next))
      pick = &c;
  if (!pick) return;
  if (Status st = start_spill(*pick->pool, *pick->t, /*drop_after=*/false); !st) {
    TState& s = ts(pick->t->id);  // e.g. the NVMe quota is full: not retried for a while
    s.spill_failed_at = now;
    s.spill_error = st;
    return;
  }
  ts(pick->t->id).cleaning = true;  // counted in cleaned_bytes once durable; one at a time
}

// --- leases ---

bool TierManager::may_place_for_overwrite(std::span<Tensor* const> tensors, LeaseMode mode) {
  // A placed tensor holds unspecified bytes and is not leased yet: anyone could read them until
  // the grant. So place only when the grant follows at once, i.e. no tensor of the lease is
  // still being fetched (the caller has checked that no conflicting lease is held).
  if (mode != LeaseMode::kOverwrite) return false;
  for (const Tensor* t : tensors) {
    auto it = ts_.find(t->id);
    if (!t->ram && it != ts_.end() && it->second.io == Io::kFetch) return false;
  }
  return true;
}

Status TierManager::place_for_overwrite(std::span<Tensor* const> tensors) {
  // All or none: a tensor placed while another waits for room would sit unleased with
  // unspecified bytes. The extents found so far are not tensors yet, so no eviction below
  // can take them; the lease's own tensors are in leasing_.
  std::vector<std::pair<Tensor*, RamLocation>> got;
  auto undo = [&] {
    for (auto& [u, loc] : got)
      if (Pool* up = catalog_.find_pool(u->pool_id)) ram_.release(*up, loc);
  };
  for (Tensor* t : tensors) {
    if (t->ram || ts(t->id).io != Io::kNone) continue;
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p) {
      undo();
      return Status(Code::kInternal, "tensor without a pool");
    }
    auto loc = allocate(*p, t->node, t->size);
    if (!loc) {
      undo();
      return loc.error();  // kBusy: write-backs are freeing RAM; retried when they complete
    }
    got.emplace_back(t, *loc);
  }
  for (auto& [t, loc] : got) {
    t->ram = loc;
    if (durable_) durable_->ram_placed(*t);
    t->dirty = true;
    ts(t->id).last_use = tick_++;
    stats_.fetches_skipped++;
  }
  return Status::ok();
}

Result<bool> TierManager::prepare_lease(uint64_t session, std::span<Tensor* const> tensors,
                                        LeaseMode mode) {
  // A grant follows at once when this returns false: the fetches and prefetches started below
  // (and the evictions they make) must not drop a tensor of this lease already found in RAM.
  leasing_.clear();
  for (Tensor* t : tensors) leasing_.insert(t->id);
  auto r = prepare_lease_impl(session, tensors, mode);
  leasing_.clear();
  return r;
}

Result<bool> TierManager::prepare_lease_impl(uint64_t session, std::span<Tensor* const> tensors,
                                             LeaseMode mode) {
  double now = now_s();
  auto pit = plans_.find(session);
  bool wait = false;
  bool moved = false;
  const bool place = may_place_for_overwrite(tensors, mode);
  if (place) {
    // kBusy: no room without waiting for write-backs; the lease waits (below) and retries.
    if (Status st = place_for_overwrite(tensors); !st && st.code() != Code::kBusy) return fail(std::move(st));
  }
  uint64_t advanced_uses = 0;
  for (Tensor* t : tensors) {
    if (pit != plans_.end() && pit->second.pool_id == t->pool_id) {
      Plan& pl = pit->second;
      bool advanced = false;
      pl.cursor = pl.index.advance_cursor(pl.cursor, t->id, tensors.size(), advanced);
      if (advanced) advanced_uses++;
    }
    TState& s = ts(t->id);
    if (t->ram) {
      stats_.hits++;
      continue;
    }
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p) return fail(Code::kInternal, "tensor without a pool");
    if (!place) {
      if (Status st = fill_if_in_no_tier(*p, *t); !st) return fail(std::move(st));
      if (t->ram) continue;
    }
    wait = true;
    if (place) continue;               // waits for room, never for a read
    if (s.io == Io::kFetch) continue;  // a prefetch is under way: a stall, not a miss
    if (!t->nvme) continue;            // in no tier: lease_ready() zero-fills it when RAM is free
    stats_.misses++;
    pin(std::span<const uint64_t>(&t->id, 1));
    // kBusy: RAM is being freed by write-backs; lease_ready() starts the fetch when they end.
    if (Status st = start_fetch(*p, *t, true, std::nullopt); !st && st.code() != Code::kBusy)
      return fail(std::move(st));
  }
  if (advanced_uses > 0) {
    // One sample per lease: the time since the plan last advanced spread over the uses this
    // lease covers (a batch's uses all arrive at once; sampled one by one, each after the
    // first would read as a zero gap and drag the estimate towards 0).
    Plan& pl = pit->second;
    const double gap = now - pl.last_advance;
    if (pl.last_advance > 0 && gap < 10.0) {
      const double per_use = gap / static_cast<double>(advanced_uses);
      pl.seconds_per_use = pl.seconds_per_use == 0 ? per_use : 0.8 * pl.seconds_per_use + 0.2 * per_use;
    }
    pl.last_advance = now;
    moved = true;
  }
  if (wait) {
    for (Tensor* t : tensors) pinned_.insert(t->id);
    stats_.stalls++;
  }
  if (moved) {
    next_prefetch_ = 0;
    schedule_prefetch();
  }
  return wait;
}

Status TierManager::lease_ready(std::span<Tensor* const> tensors, bool& ready, LeaseMode mode) {
  leasing_.clear();
  for (Tensor* t : tensors) leasing_.insert(t->id);
  Status st = lease_ready_impl(tensors, ready, mode);
  leasing_.clear();
  return st;
}

Status TierManager::lease_ready_impl(std::span<Tensor* const> tensors, bool& ready, LeaseMode mode) {
  ready = true;
  const bool place = may_place_for_overwrite(tensors, mode);
  if (place) {
    if (Status st = place_for_overwrite(tensors); !st && st.code() != Code::kBusy) return st;
  }
  for (Tensor* t : tensors) {
    if (t->ram) continue;
    TState& s = ts(t->id);
    Pool* p = catalog_.find_pool(t->pool_id);
    if (!p) return Status(Code::kNotFound, "tensor '" + t->name + "' was deleted");
    if (!place) {
      if (Status st = fill_if_in_no_tier(*p, *t); !st) return st;
      if (t->ram) continue;
    }
    ready = false;
    if (place) continue;  // waiting for room for the overwrite
    if (s.io == Io::kFetch) continue;
    if (!t->nvme) continue;  // in no tier: zero-filled above once write-backs free RAM
    if (s.error) return *s.error;
    if (Status st = start_fetch(*p, *t, true, std::nullopt); !st && st.code() != Code::kBusy) return st;
  }
  return Status::ok();
}

Status TierManager::fill_if_in_no_tier(Pool& pool, Tensor& t) {
  if (t.ram || t.nvme || ts(t.id).io != Io::kNone) return Status::ok();
  Status st = start_fetch(pool, t, true, std::nullopt);  // zero-fills: nothing to read
  return st.code() == Code::kBusy ? Status::ok() : st;
}

void TierManager::lease_waited(Clock::duration waited) {
  stats_.stall_us += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(waited).count());
}

void TierManager::on_granted(std::span<Tensor* const> tensors, LeaseMode mode) {
  for (Tensor* t : tensors) {
    TState& s = ts(t->id);
    s.last_use = tick_++;
    if (is_write(mode)) {
      s.write_gen++;
      s.dead = false;
      t->dirty = true;
    }
  }
}

Status TierManager::adopt_catalog() {
  for (const auto& [name, pid] : catalog_.pool_names()) {
    Pool* p = catalog_.find_pool(pid);
    if (!p) continue;
    for (auto& [id, t] : p->tensors) {
      if (!t.nvme) continue;
      if (Status st = engine_->adopt(*t.nvme); !st) {
        log_error("tensor '{}' (pool '{}'): its journaled NVMe copy is unusable: {}", t.name, p->name, st.message());
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

void TierManager::discard(std::span<Tensor* const> tensors) {
  for (Tensor* t : tensors) {
    ts(t->id).discarded_before = true;
    if (!t->ram || t->writer || !needs_writeback(*t)) continue;
    TState& s = ts(t->id);
    if (s.io != Io::kNone || s.torn_copy) continue;
    if (t->nvme) {
      // The write lease that made it dirty journaled the NVMe copy as dropped: record it
      // again, so the journal and memory agree that it is the tensor's fallback.
      if (durable_) durable_->nvme_copy_written(*t, *t->nvme);
      t->dirty = false;
    } else {
      s.dead = true;
    }
    stats_.discarded_bytes += t->size;
  }
}

Result<std::byte*> TierManager::place_for_restore(Pool& pool, Tensor& t) {
  wait_idle(t.id);
  while (!t.ram) {
    auto loc = allocate(pool, t.node, t.size);
    if (loc) {
      t.ram = *loc;
      if (durable_) durable_->ram_placed(t);
      stats_.fetches_skipped++;
      break;
    }
    // kBusy: only write-backs in flight can free the room; wait for them.
    if (loc.error().code() != Code::kBusy || engine_->pending() == 0) return fail(loc.error());
    engine_->wait();
    flush_drops();
  }
  Tensor* one = &t;
  on_granted(std::span<Tensor* const>(&one, 1), LeaseMode::kWrite);
  std::byte* p = ram_ptr(*t.ram);
  if (!p) return fail(Code::kInternal, "tensor '" + t.name + "': its arena is not mapped");
  return p;
}

void TierManager::forget(Pool& pool, Tensor& t) {
  wait_idle(t.id);
  auto it = ts_.find(t.id);
  if (it != ts_.end() && it->second.drop_after && it->second.io == Io::kSpill && t.ram)
    writeback_pending_bytes_ -= std::min(writeback_pending_bytes_, t.ram->length);
  ts_.erase(t.id);
  pinned_.erase(t.id);
  if (t.nvme) {
    if (Status st = engine_->free(*t.nvme); !st) log_warn("freeing the NVMe copy of '{}': {}", t.name, st.message());
    pool.nvme_used -= std::min(pool.nvme_used, nvme_bytes(*t.nvme));
    t.nvme.reset();
    nvme_freed_at_ = now_s();  // write-backs refused for space may be retried at once
  }
}

// --- requests ---

Status TierManager::prefetch(Pool& pool, std::span<Tensor* const> tensors) {
  for (Tensor* t : tensors) {
    if (t->ram || !t->nvme || ts(t->id).io == Io::kFetch) continue;
    // A hint: no room without waiting for write-backs (kBusy) skips this tensor.
    Status st = start_fetch(pool, *t, true, std::nullopt);
    if (!st && st.code() == Code::kBusy) continue;
    TIER_RETURN_IF_ERROR(st);
    stats_.prefetches++;
  }
  return Status::ok();
}

Status TierManager::evict(Pool& pool, std::span<Tensor* const> tensors, size_t& skipped) {
  skipped = 0;
  std::vector<Tensor*> spilling, clean;
  for (Tensor* t : tensors) {
    wait_idle(t->id);
    if (!t->ram) continue;
    if (t->readers > 0 || t->writer) {
      ++skipped;
      continue;
    }
    if (!needs_writeback(*t)) {
      clean.push_back(t);
      continue;
    }
    if (Status st = start_spill(pool, *t, false); !st) {
      drop_ram_many(clean);
      return st;
    }
    spilling.push_back(t);
  }
  drop_ram_many(clean);
  clean.clear();
  Status first;
  for (Tensor* t : spilling) {
    wait_idle(t->id);
    if (!t->ram) continue;
    if (needs_writeback(*t)) {
      if (first.is_ok())
        first = Status(Code::kIo, "write-back of tensor '" + t->name + "' failed (see the daemon log); it stays in RAM");
      if (t->readers == 0 && !t->writer) continue;
    }
    if (t->readers > 0 || t->writer) {
      ++skipped;
      continue;
    }
    clean.push_back(t);
  }
  drop_ram_many(clean);
  return first;
}

Status TierManager::set_plan(uint64_t session, Pool& pool, std::vector<uint64_t> ids, uint64_t budget,
                             std::vector<uint8_t> overwrite) {
  if (ids.empty()) {
    plans_.erase(session);
    return Status::ok();
  }
  Plan pl;
  pl.pool_id = pool.id;
  pl.index = policy::PlanIndex(std::move(ids), std::move(overwrite));
  pl.budget = budget != 0 ? budget : static_cast<uint64_t>(static_cast<double>(ram_.capacity()) * marks_.low * kDefaultPlanBudget);
  plans_[session] = std::move(pl);
  next_prefetch_ = 0;
  return Status::ok();
}

void TierManager::session_closed(uint64_t session) {
  plans_.erase(session);
  dma_pins_.drop_session(session);
}

// --- the loop ---

void TierManager::schedule_prefetch() {
  double now = now_s();
  double next = std::numeric_limits<double>::infinity();
  double bw = engine_->measured_bandwidth();
  if (bw <= 0) bw = 1e9;
  for (auto& [sid, pl] : plans_) {
    Pool* pool = catalog_.find_pool(pl.pool_id);
    if (!pool) continue;
    policy::PrefetchInput in;
    in.plan = &pl.index;
    in.cursor = pl.cursor;
    in.present = [&](uint64_t id) {
      Tensor* t = catalog_.find_tensor(id);
      if (!t) return true;  // deleted: nothing to fetch
      auto it = ts_.find(id);
      // In no tier: nothing to read (a lease zero-fills it).
      return t->ram.has_value() || !t->nvme || (it != ts_.end() && it->second.io == Io::kFetch);
    };
    in.bytes_of = [&](uint64_t id) {
      Tensor* t = catalog_.find_tensor(id);
      return t ? t->size : uint64_t{0};
    };
    in.budget_bytes = pl.budget;
    in.ahead_bytes = std::max<uint64_t>(pl.budget / 4, 1);
    in.bandwidth = bw;
    in.seconds_per_use = pl.seconds_per_use;
    in.now = now;
    if (pl.last_advance > 0) in.cursor_at = pl.last_advance + pl.seconds_per_use;
    in.margin = kPrefetchMargin;
    policy::PrefetchPlan pp = policy::plan_prefetch(in);
    for (const auto& item : pp.items) {
      if (item.start_at > now) continue;
      Tensor* t = catalog_.find_tensor(item.id);
      if (!t || t->pool_id != pool->id) continue;
      Status st = start_fetch(*pool, *t, false, Ahead{item.distance, pl.seconds_per_use});
      if (st) {
        if (ts(t->id).io == Io::kFetch) stats_.prefetches++;
      } else {
        break;  // no clean room now: try again when something completes
      }
    }
    next = std::min(next, pp.next_start);
  }
  next_prefetch_ = next;
  arm_timer();
}

void TierManager::arm_timer() {
  const double next = std::min(next_prefetch_, clean_due_);
  itimerspec its{};
  if (std::isfinite(next)) {
    double at = std::max(next, now_s() + 1e-4);
    its.it_value.tv_sec = static_cast<time_t>(at);
    its.it_value.tv_nsec = static_cast<long>((at - std::floor(at)) * 1e9);
  }
  ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

bool TierManager::poll() {
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

void TierManager::fill_status(wire::StatusRep& r) const {
  nvme::EngineStats es = engine_->stats();
  for (const auto& d : es.dirs)
    r.nvme.push_back(wire::NvmeTierW{d.path, d.numa_node, d.backend, d.capacity, d.used});
  for (auto& n : r.ram) n.dirty = 0;
  for (const auto& [name, pid] : catalog_.pool_names()) {
    const Pool* p = const_cast<Catalog&>(catalog_).find_pool(pid);
    if (!p) continue;
    for (const auto& [id, t] : p->tensors) {
      if (!t.ram || !needs_writeback(t)) continue;
      for (auto& n : r.ram)
        if (n.node == t.ram->node) n.dirty += t.ram->length;
    }
  }
  r.bytes_read = es.fetch_bytes;
  r.bytes_written = es.spill_bytes;
  r.hits = stats_.hits;
  r.misses = stats_.misses;
  r.stalls = stats_.stalls;
  r.evictions = stats_.evictions;
  r.prefetches = stats_.prefetches;
}

}  // namespace tier::daemon
