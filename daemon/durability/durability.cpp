#include "durability/durability.hpp"

#include "core/lease_holder.hpp"

#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <type_traits>

#include "base/log.hpp"
#include "nvme/location.hpp"
#include "ram/arena.hpp"
#include "core/catalog.hpp"
#include "ram/ram_tier.hpp"
#include "nvme/engine.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

namespace fs = std::filesystem;
using namespace tier::journal;

namespace {

// The catalog's NvmeLocation becomes nvme::NvmeLocation with the NVMe tier; until then a
// journaled copy cannot be represented in the catalog and is kept only in the image.
template <class Opt> void set_nvme(Opt& dst, const NvmeCopyWritten& w) {
  if constexpr (std::is_assignable_v<Opt&, nvme::NvmeLocation>) {
    nvme::NvmeLocation loc;
    for (const Extent& e : w.extents) {
      nvme::Extent x;
      x.dir = static_cast<uint16_t>(std::stoul(e.dir.empty() ? "0" : e.dir));
      x.file = static_cast<uint32_t>(std::stoul(e.file.empty() ? "0" : e.file));
      x.offset = e.offset;
      x.length = e.length;
      x.checksum = e.checksum;
      loc.size += e.length;
      loc.extents.push_back(x);
    }
    dst = std::move(loc);
  } else {
    (void)dst;
    (void)w;
  }
}

}  // namespace

Durability::~Durability() {
  jobs_.clear();  // cancels and joins the snapshot writers
  for (Remover& r : removers_) r.thread.join();
  if (efd_ >= 0) ::close(efd_);
}

Result<std::unique_ptr<Durability>> Durability::open(DurabilityDeps deps, RecoveryReport* report) {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Durability> d(new Durability(std::move(deps)));
  std::string jdir = d->deps_.state_dir + "/journal";
  // 0700, also when an older tierd made them 0755: snapshot directories name pools.
  if (Status st = make_private_dir(jdir); !st)
    return fail(Code::kIo, "cannot create " + jdir + ": " + st.message());
  if (Status st = make_private_dir(d->snapshot_root()); !st)
    return fail(Code::kIo, "cannot create " + d->snapshot_root() + ": " + st.message());
  d->efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->efd_ < 0) return fail(Status::from_errno(errno, "eventfd"));
  if (!d->deps_.snapshot_free_floor.empty()) {  // before anything is appended
    auto space = StateSpace::open(d->deps_.state_dir, d->deps_.snapshot_free_floor, d->deps_.journal_reserve);
    TIER_TRY(space);
    d->space_ = std::move(*space);
  }

  OpenReport orep;
  auto j = Journal::open(jdir, JournalOptions{}, d->image_.replayer(), &orep);
  if (!j) {
    const Status& e = j.error();
    return fail(e.code(), "journal " + jdir + "/" + std::string(Journal::kFileName) + ": " + e.message());
  }
  d->journal_ = std::move(*j);
  RecoveryReport& r = d->report_;
  r.records = orep.records;
  r.fresh = orep.records == 0;
  r.dropped_tail_bytes = orep.dropped_tail_bytes;
  if (orep.dropped_tail_bytes)
    log_warn("journal: dropped a torn tail of {} bytes (a record being written when tierd died)",
             orep.dropped_tail_bytes);
  TIER_TRY(d->rebuild());
  d->clean_snapshot_dirs();
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!r.fresh)
    log_info(
        "recovered {} pools, {} tensors from {} journal records in {:.1f} ms: {} arenas "
        "re-attached, {} recreated (gone: reboot), {} refused (not tierd's or damaged), {} tensors restored "
        "from snapshots, {} "
        "from NVMe, {} lost; {} partial snapshots removed",
        r.pools, r.tensors, r.records, r.ms, r.arenas_attached, r.arenas_lost, r.arenas_refused,
        r.restored_from_snapshot, r.restored_from_nvme, r.lost_tensors, r.partial_snapshots_removed);
  if (report) *report = r;
  return d;
}

Status Durability::rebuild() {
  Catalog& cat = deps_.catalog;
  RecoveryReport& r = report_;
  const Watermarks& marks = image_.watermarks();
  // Pools, arenas, tensors; tensors whose arena was gone wait in `need` for a snapshot.
  struct Lost {
    uint64_t pool;
    std::vector<uint64_t> tensors;
  };
  std::vector<Lost> lost;
  for (const auto& [pid, pi] : image_.pools()) {
    cat.set_next_ids(pid, marks.next_tensor_id);
    auto p = cat.create_pool(pi.meta.name, pi.meta.owner_uid, pi.meta.ram_quota, pi.meta.nvme_quota);
    if (!p) return Status(Code::kCorruption, "journal: pool '" + pi.meta.name + "': " + p.error().message());
    Pool& pool = **p;
    if (pi.meta.flags & journal::kPoolGroupRead) {
      pool.group = static_cast<gid_t>(pi.meta.group);
      pool.group_read = true;
    }
    r.pools++;
    std::vector<uint64_t> gone_arenas;
    std::vector<ArenaCreated> renamed;  // arenas re-created under a new name: journaled below
    for (const auto& [aid, a] : pi.arenas) {
      uint64_t min_size = 0;  // the object must hold every journaled extent
      for (const auto& [tid, ti] : pi.tensors)
        if (ti.meta.arena_id == aid) min_size = std::max(min_size, ti.meta.offset + ti.meta.ram_length);
      auto attached = deps_.ram.attach_arena(pool, a.numa_node, a.shm_name, a.size, min_size);
      if (!attached)
        return Status(attached.error().code(), "pool '" + pool.name + "': " + attached.error().message());
      if (*attached == RamTier::Attach::kAttached) {
        r.arenas_attached++;
        continue;
      }
      gone_arenas.push_back(aid);
      recreated_arenas_.insert(aid);  // gone or refused: write leases into it cannot be kept
      if (*attached == RamTier::Attach::kGone) {
        r.arenas_lost++;
        log_warn("pool '{}': arena {} is gone (reboot?); restoring from the latest snapshot", pool.name,
                 a.shm_name);
      } else {
        r.arenas_refused++;
      }
      if (Arena* fresh = deps_.ram.arena(aid))
        renamed.push_back(ArenaCreated{pid, aid, a.numa_node, fresh->path(), fresh->size()});
    }
    for (const ArenaCreated& rec : renamed) append(rec);
    Lost pool_lost{pid, {}};
    for (const auto& [tid, ti] : pi.tensors) {
      const TensorCreated& m = ti.meta;
      cat.set_next_ids(marks.next_pool_id, tid);
      TensorDesc desc{m.name, m.size, static_cast<DType>(m.dtype), m.shape, {}};
      // A tensor evicted to NVMe has no RAM node in the journal; it comes back on the pool's
      // node (its first arena's), else the first node.
      int32_t node = m.numa_node;
      if (node < 0) node = !pi.arenas.empty() ? pi.arenas.begin()->second.numa_node : deps_.default_node;
      auto t = cat.create_tensor(pool, std::move(desc), node);
      if (!t) return Status(Code::kCorruption, "journal: tensor '" + m.name + "': " + t.error().message());
      Tensor& tensor = **t;
      r.tensors++;
      if (ti.nvme) set_nvme(tensor.nvme, *ti.nvme);
      if (m.arena_id != 0) {
        RamLocation loc{m.arena_id, m.numa_node, m.offset, m.ram_length};
        TIER_TRY(deps_.ram.reserve(pool, loc));
        tensor.ram = loc;
        if (std::find(gone_arenas.begin(), gone_arenas.end(), m.arena_id) != gone_arenas.end())
          pool_lost.tensors.push_back(tid);
      }
    }
    if (!pool_lost.tensors.empty()) lost.push_back(std::move(pool_lost));
  }
  cat.set_next_ids(marks.next_pool_id, marks.next_tensor_id);
  remove_stale_arenas();

  // Reboot: bring back what the snapshot (or a journaled NVMe copy) holds; the rest is lost.
  for (Lost& l : lost) {
    Pool* p = cat.find_pool(l.pool);
    std::vector<Tensor*> need;
    for (uint64_t id : l.tensors) {
      Tensor* t = cat.find_tensor(id);
      if (!t) continue;
      const TensorImage* ti = image_.tensor(id);
      if (ti && ti->nvme) {
        // A journaled NVMe copy is at least as new as any snapshot (a write lease drops it):
        // the tensor lives on NVMe now and the NVMe tier fetches it on its first lease.
        deps_.ram.release(*p, *t->ram);
        t->ram.reset();
        ram_dropped(*t);
        r.restored_from_nvme++;
        continue;
      }
      need.push_back(t);
    }
    uint64_t from = 0;
    TIER_TRY(restore_pool_from_snapshot(*p, need, &from));
    uint64_t lost_here = 0;
    for (Tensor* t : need) {  // what the snapshot did not cover
      log_warn("pool '{}': tensor '{}' (id {}) was only in RAM and not in a snapshot: lost", p->name, t->name,
               t->id);
      deps_.ram.release(*p, *t->ram);
      t->ram.reset();
      tensor_deleted(*t);
      deps_.catalog.erase_tensor(*p, t->id);
      ++lost_here;
    }
    r.lost_tensors += lost_here;
    // The pool is now a mix of `from` and newer NVMe copies: say so until it is restored.
    append(PoolRecovered{p->id, from, lost_here});
    if (lost_here)
      log_warn("pool '{}': {} tensors lost in the reboot (created or only in RAM after its last snapshot)",
               p->name, lost_here);
  }
  return Status::ok();
}

void Durability::remove_stale_arenas() {
  std::string want = arena_prefix(deps_.state_dir) + "-";
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (!name.starts_with(want)) continue;
    if (!deps_.ram.has_object("/" + name)) stale.push_back(name);
  }
  ::closedir(dir);
  for (const auto& name : stale) {
    if (::shm_unlink(("/" + name).c_str()) == 0) {
      report_.stale_arenas_removed++;
      log_warn("removed arena /dev/shm/{}: the journal does not name it", name);
    }
  }
}

void Durability::clean_snapshot_dirs() {
  // Keep, per pool, the snapshots the journal records as durable and not dropped (their
  // manifest and directories were fsynced before SnapshotDurable was appended; older ones
  // beyond a snapshot's `keep` were dropped in the journal when it became durable); anything
  // else under the snapshot root is a snapshot being written when tierd died, or one whose
  // removal the journal recorded.
  std::set<std::pair<std::string, std::string>> keep;  // (pool directory, snapshot id)
  for (const auto& [pid, pi] : image_.pools()) {
    std::vector<uint64_t> drop;
    for (const auto& [sid, s] : pi.snapshots) {
      if (!s.durable) {
        drop.push_back(sid);
        continue;
      }
      fs::path sp(s.path);
      keep.emplace(sp.parent_path().filename().string(), sp.filename().string());
    }
    for (uint64_t sid : drop) append(SnapshotDropped{pid, sid});
  }
  std::error_code ec;
  for (const auto& pool_dir : fs::directory_iterator(snapshot_root(), ec)) {
    if (!pool_dir.is_directory(ec)) continue;
    std::string pool_name = pool_dir.path().filename().string();
    (void)::chmod(pool_dir.path().c_str(), 0700);
    std::vector<fs::path> gone;
    for (const auto& snap : fs::directory_iterator(pool_dir.path(), ec)) {
      if (keep.contains({pool_name, snap.path().filename().string()}))
        (void)::chmod(snap.path().c_str(), 0700);
      else gone.push_back(snap.path());
    }
    for (const fs::path& g : gone) {
      std::error_code rec;
      fs::remove_all(g, rec);
      if (rec) {
        log_warn("cannot remove the partial snapshot {}: {}", g.string(), rec.message());
        continue;
      }
      report_.partial_snapshots_removed++;
      log_warn("removed snapshot directory {}: not a complete snapshot the journal keeps", g.string());
    }
    if (fs::is_empty(pool_dir.path(), ec) && !deps_.catalog.find_pool(pool_name))
      fs::remove(pool_dir.path(), ec);
  }
  // The snapshots kept are charged to their pools' NVMe quotas as what they take on disk.
  for (const auto& [pid, pi] : image_.pools())
    for (const auto& [sid, s] : pi.snapshots)
      if (s.durable) snapshot_disk_[{pid, sid}] = measure_snapshot(s.path);
}

void Durability::append(const Record& r) {
  if (!failed_.is_ok()) return;
  bool ack = std::holds_alternative<PoolCreated>(r) || std::holds_alternative<PoolDropped>(r) ||
             std::holds_alternative<TensorCreated>(r) || std::holds_alternative<TensorDeleted>(r);
  bool lease = std::holds_alternative<WriteLeaseHeld>(r) || std::holds_alternative<WriteLeaseEnded>(r);
  if (Status st = image_.apply(r); !st) {
    log_error("internal: journal record refused by the catalog image: {}", st.message());
    return;
  }
  // A dropped snapshot (or pool) is no longer charged.
  if (const auto* d = std::get_if<SnapshotDropped>(&r)) snapshot_disk_.erase({d->pool_id, d->snapshot_id});
  if (const auto* d = std::get_if<PoolDropped>(&r))
    std::erase_if(snapshot_disk_, [&](const auto& e) { return e.first.first == d->pool_id; });
  auto seq = journal_->append(r);
  // A full disk (something else filled it: snapshots keep above a floor): the journal's
  // reserve goes back to the file system and the append is tried again.
  if (!seq && seq.error().code() == Code::kResourceExhausted && space_.release_reserve())
    seq = journal_->append(r);
  if (seq && ack) ack_seq_ = *seq;
  if (seq && !lease) sync_seq_ = *seq;
  if (!seq) {
    failed_ = seq.error();
    log_error("journal append failed: {}; tierd stops acknowledging changes", failed_.message());
  }
}

Status Durability::commit() {
  TIER_TRY(failed_);
  if (pending()) {
    Status st = journal_->sync();
    if (!st) {
      failed_ = st;
      return st;
    }
  }
  if (journal_->compaction_due()) {
    uint64_t before = journal_->size_bytes();
    Status st = journal_->compact([&](const Journal::Emit& emit) { return image_.emit_live(emit); });
    if (!st) {
      if (!journal_->health().is_ok()) {
        failed_ = st;
        return st;
      }
      log_warn("journal compaction failed (the old journal stays in use): {}", st.message());
    } else {
      log_info("journal compacted: {} -> {} bytes", before, journal_->size_bytes());
    }
  }
  return Status::ok();
}

// --- records ---

PoolCreated pool_record(const Pool& p) {
  PoolCreated r{p.id, p.name, static_cast<uint32_t>(p.owner_uid), 0, 0, p.ram_quota, p.nvme_quota};
  if (p.group_read && p.group != kNoGroup) {
    r.group = static_cast<uint32_t>(p.group);
    r.flags |= kPoolGroupRead;
  }
  return r;
}

void Durability::pool_created(const Pool& p) { append(pool_record(p)); }

void Durability::pool_dropped(const Pool& p) {
  append(PoolDropped{p.id});
  // A snapshot of it stops before its directory goes (poll() then answers its request).
  for (auto& j : jobs_)
    if (j->pool_id == p.id) j->writer->cancel();
  remove_later(snapshot_root() + "/" + p.name);
}

void Durability::remove_later(const std::string& path) {
  std::erase_if(removers_, [](Remover& r) {
    if (!r.done->load()) return false;
    r.thread.join();
    return true;
  });
  std::string trash =
      snapshot_root() + "/.removing-" + std::to_string(::getpid()) + "-" + std::to_string(++removals_);
  std::error_code ec;
  if (::rename(path.c_str(), trash.c_str()) != 0) {
    if (errno == ENOENT) return;
    trash = path;  // cannot rename: remove it where it is
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  try {
    removers_.push_back({std::thread([trash, done] {
                           std::error_code e;
                           fs::remove_all(trash, e);
                           if (e) log_warn("removing {}: {}", trash, e.message());
                           done->store(true);
                         }),
                         done});
  } catch (const std::system_error&) { fs::remove_all(trash, ec); }
}

TensorCreated tensor_record(const Tensor& t) {
  TensorCreated r;
  r.pool_id = t.pool_id;
  r.tensor_id = t.id;
  r.name = t.name;
  r.size = t.size;
  r.dtype = static_cast<uint8_t>(t.dtype);
  r.shape = t.shape;
  r.numa_node = t.node;
  if (t.ram) {
    r.numa_node = t.ram->node;
    r.arena_id = t.ram->arena_id;
    r.offset = t.ram->offset;
    r.ram_length = t.ram->length;
  }
  return r;
}

void Durability::tensor_created(const Tensor& t) {
  if (t.ram) {
    const journal::PoolImage* pi = nullptr;
    if (auto it = image_.pools().find(t.pool_id); it != image_.pools().end()) pi = &it->second;
    if (pi && !pi->arenas.contains(t.ram->arena_id)) {
      if (Arena* a = deps_.ram.arena(t.ram->arena_id))
        append(ArenaCreated{t.pool_id, t.ram->arena_id, t.ram->node, a->path(), a->size()});
    }
  }
  append(tensor_record(t));
}

void Durability::tensor_deleted(const Tensor& t) { append(TensorDeleted{t.pool_id, t.id}); }

void Durability::ram_placed(const Tensor& t) {
  if (!t.ram) return ram_dropped(t);
  const journal::PoolImage* pi = nullptr;
  if (auto it = image_.pools().find(t.pool_id); it != image_.pools().end()) pi = &it->second;
  if (pi && !pi->arenas.contains(t.ram->arena_id)) {
    if (Arena* a = deps_.ram.arena(t.ram->arena_id))
      append(ArenaCreated{t.pool_id, t.ram->arena_id, t.ram->node, a->path(), a->size()});
  }
  append(TensorRamPlaced{t.id, t.ram->node, t.ram->arena_id, t.ram->offset, t.ram->length});
}

void Durability::ram_dropped(const Tensor& t) { append(TensorRamDropped{t.id}); }

void Durability::nvme_copy_written(const Tensor& t, const nvme::NvmeLocation& loc) {
  NvmeCopyWritten r;
  r.tensor_id = t.id;
  r.generation = image_.watermarks().next_generation;
  for (const nvme::Extent& e : loc.extents)
    r.extents.push_back(
        Extent{std::to_string(e.dir), std::to_string(e.file), e.offset, e.length, e.checksum});
  append(r);
}

void Durability::write_lease_held(const Tensor& t, uint64_t lease_id, const LeaseHolder& h) {
  append(WriteLeaseHeld{t.id, lease_id, static_cast<uint32_t>(h.uid), h.pid, h.pid_start, h.pid_ns});
}

void Durability::write_lease_ended(const Tensor& t) {
  const TensorImage* ti = image_.tensor(t.id);
  if (ti && ti->write_lease) append(WriteLeaseEnded{t.id});
}

void Durability::nvme_copy_dropped(const Tensor& t) {
  const TensorImage* ti = image_.tensor(t.id);
  if (!ti || !ti->nvme) return;
  append(NvmeCopyDropped{t.id, ti->nvme->generation});
}

}  // namespace tier::daemon
