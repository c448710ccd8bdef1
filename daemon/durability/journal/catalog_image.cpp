#include "journal/catalog_image.hpp"
#include "base/errors.hpp"

#include <algorithm>
#include <type_traits>

namespace tier::journal {
namespace {

Status bad(const Record& r, const std::string& why) {
  return Status(Code::kCorruption,
                std::string(record_type_name(record_type(r))) + " record contradicts the catalog: " + why);
}

void raise(uint64_t& mark, uint64_t id) {
  if (id != 0 && id != UINT64_MAX) mark = std::max(mark, id + 1);
}

}  // namespace

PoolImage* CatalogImage::pool(uint64_t id) {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : &it->second;
}

TensorImage* CatalogImage::tensor_mut(uint64_t id) {
  auto it = tensor_pool_.find(id);
  if (it == tensor_pool_.end()) return nullptr;
  PoolImage* p = pool(it->second);
  if (!p) return nullptr;
  auto t = p->tensors.find(id);
  return t == p->tensors.end() ? nullptr : &t->second;
}

const TensorImage* CatalogImage::tensor(uint64_t tensor_id) const noexcept {
  return const_cast<CatalogImage*>(this)->tensor_mut(tensor_id);
}

void CatalogImage::see_ids(uint64_t pool_id, uint64_t tensor_id, uint64_t snapshot_id, uint64_t arena_id,
                           uint64_t generation) {
  raise(marks_.next_pool_id, pool_id);
  raise(marks_.next_tensor_id, tensor_id);
  raise(marks_.next_snapshot_id, snapshot_id);
  raise(marks_.next_arena_id, arena_id);
  raise(marks_.next_generation, generation);
}

Status CatalogImage::apply(const Record& rec) {
  return std::visit(
      [&](const auto& r) -> Status {
        using T = std::decay_t<decltype(r)>;
        const std::string id_of_pool = "pool " + std::to_string([&] {
                                         if constexpr (requires { r.pool_id; }) return r.pool_id;
                                         else return uint64_t{0};
                                       }());
        if constexpr (std::is_same_v<T, PoolCreated>) {
          if (pool(r.pool_id)) return bad(rec, id_of_pool + " exists");
          for (const auto& [id, p] : pools_)
            if (p.meta.name == r.name) return bad(rec, "a pool named '" + r.name + "' exists");
          pools_[r.pool_id].meta = r;
          see_ids(r.pool_id, 0, 0, 0, 0);
        } else if constexpr (std::is_same_v<T, PoolDropped>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          for (const auto& [tid, t] : p->tensors) tensor_pool_.erase(tid);
          for (const auto& [aid, a] : p->arenas) arena_pool_.erase(aid);
          pools_.erase(r.pool_id);
        } else if constexpr (std::is_same_v<T, ArenaCreated>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          // Again for an arena of the same pool: its object was re-created under a new name
          // (the old one was gone or refused at a restart).
          if (auto it = arena_pool_.find(r.arena_id); it != arena_pool_.end() && it->second != r.pool_id)
            return bad(rec, "arena " + std::to_string(r.arena_id) + " exists");
          p->arenas[r.arena_id] = r;
          arena_pool_[r.arena_id] = r.pool_id;
          see_ids(0, 0, 0, r.arena_id, 0);
        } else if constexpr (std::is_same_v<T, TensorCreated>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          if (tensor_pool_.count(r.tensor_id))
            return bad(rec, "tensor " + std::to_string(r.tensor_id) + " exists");
          p->tensors[r.tensor_id].meta = r;
          tensor_pool_[r.tensor_id] = r.pool_id;
          see_ids(0, r.tensor_id, 0, 0, 0);
        } else if constexpr (std::is_same_v<T, TensorDeleted>) {
          auto it = tensor_pool_.find(r.tensor_id);
          if (it == tensor_pool_.end() || it->second != r.pool_id)
            return bad(rec, "no tensor " + std::to_string(r.tensor_id) + " in " + id_of_pool);
          pools_[r.pool_id].tensors.erase(r.tensor_id);
          tensor_pool_.erase(it);
        } else if constexpr (std::is_same_v<T, TensorRamPlaced>) {
          TensorImage* t = tensor_mut(r.tensor_id);
          if (!t) return bad(rec, "no tensor " + std::to_string(r.tensor_id));
          t->meta.numa_node = r.numa_node;
          t->meta.arena_id = r.arena_id;
          t->meta.offset = r.offset;
          t->meta.ram_length = r.ram_length;
        } else if constexpr (std::is_same_v<T, TensorRamDropped>) {
          TensorImage* t = tensor_mut(r.tensor_id);
          if (!t) return bad(rec, "no tensor " + std::to_string(r.tensor_id));
          t->meta.numa_node = -1;
          t->meta.arena_id = 0;
          t->meta.offset = 0;
          t->meta.ram_length = 0;
        } else if constexpr (std::is_same_v<T, NvmeCopyWritten>) {
          TensorImage* t = tensor_mut(r.tensor_id);
          if (!t) return bad(rec, "no tensor " + std::to_string(r.tensor_id));
          t->nvme = r;
          see_ids(0, 0, 0, 0, r.generation);
        } else if constexpr (std::is_same_v<T, NvmeCopyDropped>) {
          TensorImage* t = tensor_mut(r.tensor_id);
          if (!t) return bad(rec, "no tensor " + std::to_string(r.tensor_id));
          if (t->nvme && t->nvme->generation == r.generation) t->nvme.reset();
        } else if constexpr (std::is_same_v<T, WriteLeaseHeld>) {
          TensorImage* t = tensor_mut(r.tensor_id);
          if (!t) return bad(rec, "no tensor " + std::to_string(r.tensor_id));
          t->write_lease = r;
        } else if constexpr (std::is_same_v<T, WriteLeaseEnded>) {
          TensorImage* t = tensor_mut(r.tensor_id);
          if (!t) return bad(rec, "no tensor " + std::to_string(r.tensor_id));
          t->write_lease.reset();
        } else if constexpr (std::is_same_v<T, SnapshotBegun>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          if (p->snapshots.count(r.snapshot_id))
            return bad(rec, "snapshot " + std::to_string(r.snapshot_id) + " exists");
          p->snapshots[r.snapshot_id] = SnapshotImage{r.snapshot_id, r.path, false, 0};
          see_ids(0, 0, r.snapshot_id, 0, 0);
        } else if constexpr (std::is_same_v<T, SnapshotDurable>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          SnapshotImage& s = p->snapshots[r.snapshot_id];
          s.snapshot_id = r.snapshot_id;
          s.path = r.path;
          s.durable = true;
          s.bytes = r.bytes;
          see_ids(0, 0, r.snapshot_id, 0, 0);
        } else if constexpr (std::is_same_v<T, SnapshotTagged>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          auto it = p->snapshots.find(r.snapshot_id);
          if (it == p->snapshots.end())
            return bad(rec, "no snapshot " + std::to_string(r.snapshot_id) + " in " + id_of_pool);
          it->second.tag = r.tag;
        } else if constexpr (std::is_same_v<T, PoolRecovered>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          p->recovered = r;
        } else if constexpr (std::is_same_v<T, PoolRestored>) {
          PoolImage* p = pool(r.pool_id);
          if (!p) return bad(rec, "no " + id_of_pool);
          auto it = p->snapshots.find(r.snapshot_id);
          if (it == p->snapshots.end() || !it->second.durable)
            return bad(rec, "no durable snapshot " + std::to_string(r.snapshot_id) + " in " + id_of_pool);
          p->recovered.reset();
        } else if constexpr (std::is_same_v<T, SnapshotDropped>) {
          PoolImage* p = pool(r.pool_id);
          if (!p || !p->snapshots.erase(r.snapshot_id))
            return bad(rec, "no snapshot " + std::to_string(r.snapshot_id) + " in " + id_of_pool);
        } else if constexpr (std::is_same_v<T, Watermarks>) {
          marks_.next_pool_id = std::max(marks_.next_pool_id, r.next_pool_id);
          marks_.next_tensor_id = std::max(marks_.next_tensor_id, r.next_tensor_id);
          marks_.next_snapshot_id = std::max(marks_.next_snapshot_id, r.next_snapshot_id);
          marks_.next_arena_id = std::max(marks_.next_arena_id, r.next_arena_id);
          marks_.next_generation = std::max(marks_.next_generation, r.next_generation);
        } else {
          static_assert(std::is_same_v<T, ManifestBegin> || std::is_same_v<T, ManifestEnd>);
          return bad(rec, "manifest records do not belong in a journal");
        }
        return Status::ok();
      },
      rec);
}

RecordVisitor CatalogImage::replayer() {
  return [this](const Record& r, uint64_t seq, size_t offset) -> Status {
    Status st = apply(r);
    if (!st)
      return Status(st.code(), "record seq " + std::to_string(seq) + " at offset " + std::to_string(offset) +
                                   ": " + st.message());
    return st;
  };
}

Status CatalogImage::emit_live(const Journal::Emit& emit) const {
  TIER_TRY(emit(marks_));
  for (const auto& [pid, p] : pools_) {
    TIER_TRY(emit(p.meta));
    for (const auto& [aid, a] : p.arenas) TIER_TRY(emit(a));
    for (const auto& [tid, t] : p.tensors) {
      TIER_TRY(emit(t.meta));
      if (t.nvme) TIER_TRY(emit(*t.nvme));
      if (t.write_lease) TIER_TRY(emit(*t.write_lease));
    }
    for (const auto& [sid, s] : p.snapshots) {
      TIER_TRY(emit(SnapshotBegun{pid, sid, s.path}));
      if (s.tag != 0) TIER_TRY(emit(SnapshotTagged{pid, sid, s.tag}));
      if (s.durable) TIER_TRY(emit(SnapshotDurable{pid, sid, s.path, s.bytes}));
    }
    if (p.recovered) TIER_TRY(emit(*p.recovered));
  }
  return Status::ok();
}

}  // namespace tier::journal
