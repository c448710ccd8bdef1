#include "core/catalog.hpp"
#include "base/errors.hpp"
#include "base/names.hpp"

namespace tier::daemon {

Result<Pool*> Catalog::create_pool(std::string name, uid_t owner, uint64_t ram_quota, uint64_t nvme_quota) {
  TIER_TRY(validate_pool_name(name));
  if (by_name_.contains(name)) return fail(Code::kAlreadyExists, "pool '" + name + "' exists");
  auto p = std::make_unique<Pool>();
  p->id = next_pool_id_++;
  p->name = name;
  p->owner_uid = owner;
  p->ram_quota = ram_quota;
  p->nvme_quota = nvme_quota;
  Pool* raw = p.get();
  by_name_.emplace(std::move(name), raw->id);
  pools_.emplace(raw->id, std::move(p));
  return raw;
}

Pool* Catalog::find_pool(std::string_view name) noexcept {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : find_pool(it->second);
}

Pool* Catalog::find_pool(uint64_t id) noexcept {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : it->second.get();
}

void Catalog::erase_pool(uint64_t id) {
  auto it = pools_.find(id);
  if (it == pools_.end()) return;
  for (const auto& [tid, t] : it->second->tensors) tensors_.erase(tid);
  by_name_.erase(it->second->name);
  pools_.erase(it);
}

Result<Tensor*> Catalog::create_tensor(Pool& pool, TensorDesc desc, int32_t node) {
  // Structural only: a journal written before control characters were refused must still load
  // (the request handler applies the full rule to new names).
  TIER_TRY(validate_stored_tensor_name(desc.name));
  if (pool.by_name.contains(desc.name))
    return fail(Code::kAlreadyExists, "tensor '" + desc.name + "' exists in pool '" + pool.name + "'");
  uint64_t id = next_tensor_id_++;
  auto [it, ok] = pool.tensors.try_emplace(id);
  Tensor& t = it->second;
  t.id = id;
  t.pool_id = pool.id;
  t.name = desc.name;
  t.size = desc.size;
  t.dtype = desc.dtype;
  t.shape = std::move(desc.shape);
  t.node = node;
  pool.by_name.emplace(std::move(desc.name), id);
  tensors_.emplace(id, &t);
  return &t;
}

Tensor* Catalog::find_tensor(uint64_t id) noexcept {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : it->second;
}

Tensor* Catalog::find_tensor(Pool& pool, std::string_view name) noexcept {
  auto it = pool.by_name.find(std::string(name));
  if (it == pool.by_name.end()) return nullptr;
  auto t = pool.tensors.find(it->second);
  return t == pool.tensors.end() ? nullptr : &t->second;
}

void Catalog::erase_tensor(Pool& pool, uint64_t id) {
  auto it = pool.tensors.find(id);
  if (it == pool.tensors.end()) return;
  pool.by_name.erase(it->second.name);
  tensors_.erase(id);
  pool.tensors.erase(it);
}

TensorInfo tensor_info(const Tensor& t) {
  TensorInfo i;
  i.id = t.id;
  i.name = t.name;
  i.size = t.size;
  i.dtype = t.dtype;
  i.shape = t.shape;
  i.numa_node = t.ram ? t.ram->node : -1;
  i.tiers = static_cast<uint8_t>((t.ram ? kTierRam : 0) | (t.nvme ? kTierNvme : 0));
  i.dirty = t.dirty;
  i.readers = t.readers;
  i.writer = t.writer;
  return i;
}

PoolInfo pool_info(const Pool& p) {
  return PoolInfo{p.id,        p.name,           p.owner_uid, p.ram_quota, p.nvme_quota, p.ram_charged(),
                  p.nvme_used, p.tensors.size(), p.group,     p.group_read};
}

}  // namespace tier::daemon
