// RequestHandler: arena mappings (MapArena, read-only descriptors) and DMA pins (ArenaPin).
#include "rpc/request_handler.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "base/log.hpp"
#include "rpc/request_util.hpp"
#include "base/errors.hpp"

namespace tier::daemon {

using namespace tier::wire;

void RequestHandler::on_map_arena(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(MapArenaReq, req);
  bool owner = false;
  auto ar = arena_for(s, req.arena_id, owner);
  if (!ar) return reply_err(h, ar.error(), out);
  Arena* a = *ar;
  if (!owner) {
    // Group readers get a read-only fd.
    int fd = read_only_fd(*a);
    if (fd < 0) return reply_err(h, Status::from_errno(errno, "read-only arena fd"), out);
    reply_ok(h, MapArenaRep{a->id(), a->size(), a->node()}, out);
    out.fd = fd;
    return;
  }
  reply_ok(h, MapArenaRep{a->id(), a->size(), a->node()}, out);
  out.fd = a->fd();
}

Result<Arena*> RequestHandler::arena_for(const Session& s, uint64_t id, bool& owner) {
  Pool* p = state_.catalog.find_pool(arena_pool(id));
  Arena* a = p ? state_.ram->arena(id) : nullptr;
  if (!a) return fail(Code::kNotFound, "no arena " + std::to_string(id));
  owner = s.uid == p->owner_uid;
  if (!owner)  // group readers may map it read-only; anyone else is refused
    TIER_TRY(check_right(creds(s), *p, Right::kRead, state_.admin_gid));
  return a;
}

void RequestHandler::on_arena_pin(Session& s, const Header& h, std::span<const std::byte> payload,
                                  Reply& out) {
  TIER_DECODE(ArenaPinReq, req);
  bool owner = false;
  auto a = arena_for(s, req.arena_id, owner);
  if (!a) return reply_err(h, a.error(), out);
  if (req.length == 0 || req.offset > (*a)->size() || req.length > (*a)->size() - req.offset)
    return reply_err(h, Status(Code::kInvalidArgument, "pinned range is empty or outside the arena"), out);
  // The pinned pages count as the pool's RAM until punched (daemon/tiering/ram/ram_tier.hpp), and the
  // uid's pins are capped (uid_pinned_quota).
  Pool* pool = state_.catalog.find_pool(arena_pool(req.arena_id));
  Status st = req.pinned ? state_.ram->pin(*pool, s.id, s.uid, req.arena_id, req.offset, req.length,
                                           state_.sizes.uid_pinned_quota)
                         : state_.ram->unpin(*pool, s.id, req.arena_id, req.offset, req.length);
  if (!st) return reply_err(h, st, out);
  if (!req.pinned) retry_waiters();  // punched pages may be the room a waiting lease needs
  reply_ok(h, Empty{}, out);
}

int RequestHandler::read_only_fd(const Arena& a) {
  auto it = ro_fds_.find(a.id());
  if (it != ro_fds_.end()) return it->second;
  // Reopening through /proc gives a new open file description on the same object, read-only.
  std::string path = "/proc/self/fd/" + std::to_string(a.fd());
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) ro_fds_.emplace(a.id(), fd);
  return fd;
}

void RequestHandler::close_read_only_fds(uint64_t pool_id) {
  auto it = ro_fds_.lower_bound(arena_id(pool_id, 0));
  while (it != ro_fds_.end() && arena_pool(it->first) == pool_id) {
    ::close(it->second);
    it = ro_fds_.erase(it);
  }
}

}  // namespace tier::daemon
