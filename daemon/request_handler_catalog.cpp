// RequestHandler: pools and tensors (create, open, list, drop, delete).
#include "daemon/request_handler.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "daemon/admission.hpp"
#include "daemon/log.hpp"
#include "daemon/request_util.hpp"

namespace tier::daemon {

using namespace tier::wire;

namespace {

// Room left for the reply status and vector counts when filling a list reply.
constexpr size_t kListBudget = kMaxMessageBytes - 1024;

}  // namespace

void RequestHandler::on_pool_create(Session& s, const Header& h,
                                    std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(PoolCreateReq, req);
  if (Status st = validate_pool_name(req.name); !st) return reply_err(h, st, out);
  if (Pool* p = state_.catalog.find_pool(req.name)) {
    if (!req.exist_ok) return reply_err(h, Status(Code::kAlreadyExists, "pool '" + req.name + "' exists"), out);
    if (Status st = may_use(s, *p); !st) return reply_err(h, st, out);
    return reply_ok(h, to_wire(effective_info(state_, *p)), out);
  }
  uint64_t quota = req.ram_quota == 0 ? state_.sizes.pool_quota : req.ram_quota;
  if (quota > state_.ram->capacity())
    return reply_err(h, Status(Code::kResourceExhausted,
                               "RAM quota " + format_size(quota) + " exceeds the RAM tier of " +
                                   format_size(state_.ram->capacity())),
                     out);
  if (req.group_read && req.group == UINT32_MAX)
    return reply_err(h, Status(Code::kInvalidArgument, "group read access needs a group"), out);
  uint64_t nvme_quota = req.nvme_quota;
  if (uint64_t uq = state_.sizes.uid_nvme_quota; uq > 0) {
    // Per-uid NVMe quota: the pools' NVMe quotas are reserved from it (0 takes what is left).
    UidUsage u = uid_usage(state_.catalog, s.uid);
    uint64_t left = u.nvme_quota >= uq ? 0 : uq - u.nvme_quota;
    if (nvme_quota == 0) nvme_quota = left;
    if (nvme_quota == 0 || nvme_quota > left)
      return reply_err(h, Status(Code::kResourceExhausted,
                                 "uid " + std::to_string(s.uid) + " has reserved " + format_size(u.nvme_quota) +
                                     " of its NVMe quota of " + format_size(uq) + " (uid_nvme_quota); " +
                                     format_size(left) + " left"),
                       out);
  }
  auto p = state_.catalog.create_pool(req.name, s.uid, quota, nvme_quota);
  if (!p) return reply_err(h, p.error(), out);
  (*p)->group = req.group == UINT32_MAX ? kNoGroup : static_cast<gid_t>(req.group);
  (*p)->group_read = req.group_read;
  if (state_.durable) state_.durable->pool_created(**p);
  log_info("pool '{}' created by uid {} (RAM quota {})", req.name, s.uid, format_size(quota));
  reply_ok(h, to_wire(effective_info(state_, **p)), out);
}

void RequestHandler::on_pool_open(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(PoolNameReq, req);
  auto p = pool_for(s, req.name, PoolAccess::kInspect);
  if (!p) return reply_err(h, p.error(), out);
  reply_ok(h, to_wire(effective_info(state_, **p)), out);
}

void RequestHandler::on_pool_list(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(Empty, req);
  (void)req;
  PoolListRep rep;
  size_t bytes = 0;
  for (const auto& [name, id] : state_.catalog.pool_names()) {
    Pool* p = state_.catalog.find_pool(id);
    if (!p || !may_see(creds(s), *p, state_.admin_gid)) continue;
    PoolInfoW w = to_wire(effective_info(state_, *p));
    bytes += encoded_size(w);
    if (bytes > kListBudget) break;  // 1000+ pools: the rest does not fit one reply
    rep.pools.push_back(std::move(w));
  }
  reply_ok(h, rep, out);
}

void RequestHandler::on_pool_drop(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(PoolNameReq, req);
  auto pr = pool_named(req.name);
  if (!pr) return reply_err(h, pr.error(), out);
  Pool& p = **pr;
  if (s.uid != p.owner_uid && !is_admin(s)) return reply_err(h, may_use(s, p), out);
  if (p.leases > 0)
    return reply_err(h, Status(Code::kBusy, "pool '" + p.name + "' has " + std::to_string(p.leases) +
                                                " leases held"),
                     out);
  // A million-tensor pool must not stall the loop for long: extents are not freed one by one
  // (their allocators go with the arenas), only the usage counts are taken off per node.
  std::map<int32_t, std::pair<uint64_t, uint64_t>> usage;  // node -> (bytes, extents)
  for (auto& [id, t] : p.tensors) {
    if (state_.tiering) state_.tiering->forget(p, t);
    if (t.ram) {
      auto& u = usage[t.ram->node];
      u.first += t.ram->length;
      u.second++;
    }
  }
  for (const auto& [node, u] : usage) state_.ram->forget_usage(p, node, u.first, u.second);
  close_read_only_fds(p.id);
  state_.ram->drop_pool(p.id);
  log_info("pool '{}' dropped by uid {} ({} tensors)", p.name, s.uid, p.tensors.size());
  if (state_.durable) state_.durable->pool_dropped(p);
  state_.catalog.erase_pool(p.id);
  reply_ok(h, Empty{}, out);
  retry_waiters();  // waiters on its tensors now get kNotFound
}

void RequestHandler::on_tensor_create(Session& s, const Header& h,
                                      std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(TensorCreateReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kUse);
  if (!pr) return reply_err(h, pr.error(), out);
  Pool& p = **pr;
  if (Status st = validate_tensor_name(req.name); !st) return reply_err(h, st, out);
  if (req.size == 0) return reply_err(h, Status(Code::kInvalidArgument, "tensor size must be > 0"), out);
  if (req.dtype > kMaxDType) return reply_err(h, Status(Code::kInvalidArgument, "unknown dtype"), out);
  if (req.shape.size() > 8)
    return reply_err(h, Status(Code::kInvalidArgument, "a shape has at most 8 dimensions"), out);
  for (int64_t d : req.shape)
    if (d < 0) return reply_err(h, Status(Code::kInvalidArgument, "negative shape dimension"), out);
  if (req.placement_kind > 2)
    return reply_err(h, Status(Code::kInvalidArgument, "unknown placement kind"), out);
  if (Tensor* t = state_.catalog.find_tensor(p, req.name)) {
    if (!req.exist_ok || t->size != req.size)
      return reply_err(h, Status(Code::kAlreadyExists,
                                 "tensor '" + req.name + "' exists in pool '" + p.name + "'" +
                                     (t->size != req.size ? " with size " + std::to_string(t->size) : "")),
                       out);
    return reply_ok(h, to_wire(tensor_info(*t)), out);
  }
  Placement pl{static_cast<Placement::Kind>(req.placement_kind), req.placement_index};
  auto node = choose_node(state_.topology, pl, s.numa_node);
  if (!node) return reply_err(h, node.error(), out);
  // Refused now when no lease could ever hold it (daemon/admission.hpp).
  if (Status st = admit_tensor(*state_.ram, state_.tiering.get(), p, *node, req.size, req.name); !st)
    return reply_err(h, st, out);
  if (uint64_t uq = state_.sizes.uid_ram_quota; uq > 0) {
    UidUsage u = uid_usage(state_.catalog, p.owner_uid);
    if (req.size > uq - std::min(uq, u.ram_used))
      return reply_err(h, Status(Code::kResourceExhausted,
                                 "uid " + std::to_string(p.owner_uid) + " uses " + format_size(u.ram_used) +
                                     " of its RAM quota of " + format_size(uq) + " (uid_ram_quota); " +
                                     format_size(req.size) + " more do not fit"),
                       out);
  }
  auto loc = state_.tiering ? state_.tiering->allocate(p, *node, req.size)
                            : state_.ram->allocate(p, *node, req.size);
  // With an NVMe tier, room that only write-backs in flight can free is not waited for on the
  // event loop: the tensor starts in no tier (it reads as zeros, as a new tensor does) and gets
  // RAM at its first lease, which is deferred like any lease that needs room.
  const bool in_no_tier = !loc && state_.tiering && loc.error().code() == Code::kBusy;
  if (!loc && !in_no_tier) return reply_err(h, loc.error(), out);
  TensorDesc desc{std::move(req.name), req.size, static_cast<DType>(req.dtype), std::move(req.shape), pl};
  auto t = state_.catalog.create_tensor(p, std::move(desc), *node);
  if (!t) {
    if (loc) state_.ram->release(p, *loc);
    return reply_err(h, t.error(), out);
  }
  if (loc) (*t)->ram = *loc;
  if (state_.durable) state_.durable->tensor_created(**t);
  reply_ok(h, to_wire(tensor_info(**t)), out);
}

void RequestHandler::on_tensor_open(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE(TensorRefReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kInspect);
  if (!pr) return reply_err(h, pr.error(), out);
  Tensor* t = state_.catalog.find_tensor(**pr, req.name);
  if (!t)
    return reply_err(h, Status(Code::kNotFound, "no tensor '" + req.name + "' in pool '" + req.pool + "'"), out);
  reply_ok(h, to_wire(tensor_info(*t)), out);
}

void RequestHandler::on_tensor_list(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE(TensorListReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kInspect);
  if (!pr) return reply_err(h, pr.error(), out);
  const Pool& p = **pr;
  TensorListRep rep;
  size_t bytes = 0;
  uint32_t max = req.max == 0 ? UINT32_MAX : req.max;
  for (auto it = p.tensors.upper_bound(req.after_id); it != p.tensors.end(); ++it) {
    TensorInfoW w = to_wire(tensor_info(it->second));
    size_t sz = encoded_size(w);
    if (rep.tensors.size() >= max || bytes + sz > kListBudget) {
      rep.more = true;
      break;
    }
    bytes += sz;
    rep.tensors.push_back(std::move(w));
  }
  reply_ok(h, rep, out);
}

void RequestHandler::on_tensor_delete(Session& s, const Header& h,
                                      std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(TensorRefReq, req);
  auto pr = pool_for(s, req.pool, PoolAccess::kUse);
  if (!pr) return reply_err(h, pr.error(), out);
  Pool& p = **pr;
  Tensor* t = state_.catalog.find_tensor(p, req.name);
  if (!t)
    return reply_err(h, Status(Code::kNotFound, "no tensor '" + req.name + "' in pool '" + req.pool + "'"), out);
  if (t->readers > 0 || t->writer)
    return reply_err(h, Status(Code::kBusy, "tensor '" + req.name + "' is leased"), out);
  erase_tensor(p, *t);
  reply_ok(h, Empty{}, out);
  retry_waiters();
}

void RequestHandler::erase_tensor(Pool& p, Tensor& t) {
  if (state_.tiering) state_.tiering->forget(p, t);
  if (t.ram) state_.ram->release(p, *t.ram);
  if (state_.durable) state_.durable->tensor_deleted(t);
  state_.catalog.erase_tensor(p, t.id);
}

}  // namespace tier::daemon
