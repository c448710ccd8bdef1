// RequestHandler: pools and tensors (create, open, list, drop, delete).
#include "rpc/request_handler.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "rpc/request_util.hpp"
#include "base/names.hpp"

namespace tier::daemon {

using namespace tier::wire;

namespace {

// Room left for the reply status and vector counts when filling a list reply.
constexpr size_t kListBudget = kMaxMessageBytes - 1024;

Status no_tensor(const TensorRefReq& req) {
  return Status(Code::kNotFound, "no tensor '" + req.name + "' in pool '" + req.pool + "'");
}

}  // namespace

void RequestHandler::on_pool_create(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE(PoolCreateReq, req);
  if (Status st = validate_pool_name(req.name); !st) return reply_err(h, st, out);
  if (Pool* p = state_.catalog.find_pool(req.name)) {
    if (!req.exist_ok)
      return reply_err(h, Status(Code::kAlreadyExists, "pool '" + req.name + "' exists"), out);
    if (Status st = may_use(s, *p); !st) return reply_err(h, st, out);
    return reply_ok(h, to_wire(effective_info(state_, *p)), out);
  }
  auto p = pools_.create_pool(s.uid, req);
  if (!p) return reply_err(h, p.error(), out);
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
    return reply_err(
        h, Status(Code::kBusy, "pool '" + p.name + "' has " + std::to_string(p.leases) + " leases held"),
        out);
  close_read_only_fds(p.id);
  pools_.drop_pool(p, s.uid);
  reply_ok(h, Empty{}, out);
  retry_waiters();  // waiters on its tensors now get kNotFound
}

void RequestHandler::on_tensor_create(Session& s, const Header& h, std::span<const std::byte> payload,
                                      Reply& out) {
  TIER_DECODE_IN_POOL(TensorCreateReq, req, p, kUse);
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
      return reply_err(h,
                       Status(Code::kAlreadyExists,
                              "tensor '" + req.name + "' exists in pool '" + p.name + "'" +
                                  (t->size != req.size ? " with size " + std::to_string(t->size) : "")),
                       out);
    return reply_ok(h, to_wire(tensor_info(*t)), out);
  }
  auto t = pools_.create_tensor(p, req, s.numa_node);
  if (!t) return reply_err(h, t.error(), out);
  reply_ok(h, to_wire(tensor_info(**t)), out);
}

void RequestHandler::on_tensor_open(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE_IN_POOL(TensorRefReq, req, p, kInspect);
  Tensor* t = state_.catalog.find_tensor(p, req.name);
  if (!t) return reply_err(h, no_tensor(req), out);
  reply_ok(h, to_wire(tensor_info(*t)), out);
}

void RequestHandler::on_tensor_list(Session& s, const Header& h, std::span<const std::byte> payload,
                                    Reply& out) {
  TIER_DECODE_IN_POOL(TensorListReq, req, p, kInspect);
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

void RequestHandler::on_tensor_delete(Session& s, const Header& h, std::span<const std::byte> payload,
                                      Reply& out) {
  TIER_DECODE_IN_POOL(TensorRefReq, req, p, kUse);
  Tensor* t = state_.catalog.find_tensor(p, req.name);
  if (!t) return reply_err(h, no_tensor(req), out);
  if (t->readers > 0 || t->writer)
    return reply_err(h, Status(Code::kBusy, "tensor '" + req.name + "' is leased"), out);
  erase_tensor(p, *t);
  reply_ok(h, Empty{}, out);
  retry_waiters();
}

void RequestHandler::erase_tensor(Pool& p, Tensor& t) { pools_.erase_tensor(p, t); }

}  // namespace tier::daemon
