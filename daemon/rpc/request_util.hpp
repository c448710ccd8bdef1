// Private to the request handler's files (daemon/request_handler*.cpp): the one way a
// request body is decoded, and small helpers they share. Not for other code.
#pragma once

#include <chrono>
#include <cstdint>

#include "leases/access.hpp"
#include "rpc/request_handler.hpp"
#include "wire/messages.hpp"

namespace tier::daemon {

// Decodes the request body `payload` into `var` of type T, or replies with the decode error
// (kProtocol) and returns. For handlers of the form (Session&, const Header& h, payload, Reply& out).
#define TIER_DECODE(T, var)                                \
  auto var##_r = wire::decode<T>(payload);                 \
  if (!var##_r) return reply_err(h, var##_r.error(), out); \
  T& var = *var##_r

// TIER_DECODE, then the pool the request's `pool` field names as `pool_var`, when the session
// may use it (PoolAccess::kUse) or inspect it (kInspect); otherwise replies and returns.
#define TIER_DECODE_IN_POOL(T, var, pool_var, access)                            \
  TIER_DECODE(T, var);                                                           \
  auto pool_var##_r = pool_for(s, var.pool, RequestHandler::PoolAccess::access); \
  if (!pool_var##_r) return reply_err(h, pool_var##_r.error(), out);             \
  Pool& pool_var = **pool_var##_r

constexpr uint16_t kType(wire::MsgType t) { return static_cast<uint16_t>(t); }

inline PeerCreds creds(const Session& s) { return PeerCreds{s.uid, s.gid, s.groups}; }

// A pool as clients see it: a stored NVMe quota of 0 means the daemon's default
// (nvme_pool_quota of the NVMe tier), so the effective quota is reported, as enforced.
inline PoolInfo effective_info(const DaemonState& st, const Pool& p) {
  PoolInfo i = pool_info(p);
  if (st.tiering) i.nvme_quota = st.tiering->nvme_quota(p);
  return i;
}

inline uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

inline uint64_t ms_since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

}  // namespace tier::daemon
