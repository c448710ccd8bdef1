// tier::Client: the public API over one Connection and the table of mapped arenas.
//
// Every public call takes Impl::mu for its whole request/reply exchange, so calls from many
// threads are serialized on the socket and replies can never be matched to the wrong caller.
// The lease/release hot path reuses the request and reply structs kept in Impl (their vectors
// keep their capacity), so a warm lease or release does not touch the heap.
#include "tier/client.hpp"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "client/arena_map.hpp"
#include "client/connection.hpp"
#include "client/held_leases.hpp"
#include "wire/messages.hpp"
#include "base/errors.hpp"
#include "base/names.hpp"

namespace tier {

using wire::MsgType;

namespace {

// Grants per lease request: a LeaseGrant is 40 bytes on the wire, so 1024 of them (40 KiB)
// keep the reply well inside the 64 KiB datagram limit, which wire::kMaxBatch (4096) would not.
constexpr size_t kLeaseChunk = 1024;

int32_t current_numa_node() {
  unsigned cpu = 0, node = 0;
  if (::getcpu(&cpu, &node) != 0) return -1;
  return static_cast<int32_t>(node);
}

// Runs a public API body so that no exception leaves libtier: an allocation failure becomes
// kResourceExhausted, anything else kInternal (short messages, so building them cannot throw).
template <class R, class F> R guarded(F&& body) noexcept {
  auto as_error = [](Code code, const char* msg) -> R {
    if constexpr (std::is_same_v<R, Status>) return Status(code, msg);
    else if constexpr (requires { typename R::error_type; }) return R(std::unexpected(Status(code, msg)));
    else return R{};
  };
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return as_error(Code::kResourceExhausted, "out of memory");
  } catch (...) { return as_error(Code::kInternal, "exception"); }
}

std::string default_client_name() {
  const char* n = program_invocation_short_name;
  return (n && *n) ? std::string(n) : std::string("libtier");
}

}  // namespace

std::string default_socket_path() {
  const char* env = std::getenv("TIERD_SOCKET");
  if (env && *env) return env;
  return kDefaultSocketPath;
}

// Hidden: nested in an exported class, it would otherwise be exported with it.
struct [[gnu::visibility("hidden")]] Client::Impl {
  mutable std::mutex mu;
  std::string path;
  ConnectOptions opts;
  uint32_t epoch = 0;       // bumped by each reconnect
  client::HeldLeases held;  // leases the caller holds, for re-acquiring them
  // Why each lease lost in a reconnect was lost, by (id, epoch) as the Lease carries them;
  // an entry goes when that lease's release reports it.
  std::map<std::pair<uint64_t, uint32_t>, std::string> lost_why;
  uint64_t session_id = 0;
  std::string daemon_version;
  client::Connection conn;
  client::ArenaMap arenas;
  // Reused by the hot path (guarded by mu).
  wire::LeaseReq lease_req;
  wire::LeaseRep lease_rep;
  wire::ReleaseReq release_req;
  wire::Empty empty;
  // Ranges this client told tierd are pinned for DMA (pin_for_dma), re-sent after a reconnect
  // for arenas that are still the same object. Guarded by mu.
  std::vector<wire::ArenaPinReq> dma_pins;

  // Runs `attempt` (one request/reply on conn); when it finds the daemon gone, reconnects
  // (re-acquiring the held leases) and runs it once more. A request that is not idempotent and
  // was sent before the link died is not repeated: the daemon may have applied it. Caller
  // holds mu.
  template <class F> Status retrying(F&& attempt, bool idempotent = true) {
    Status st = attempt();
    if (st.is_ok() || st.code() != Code::kUnavailable || conn.is_open() ||
        opts.reconnect_timeout.count() <= 0)
      return st;
    bool sent = conn.last_sent();
    TIER_TRY(reconnect(st));
    if (sent && !idempotent)
      return Status(Code::kUnavailable,
                    "tierd restarted while this request was in flight: it may or may not have "
                    "been applied (the connection is back; check and retry)");
    return attempt();
  }
  template <class Req, class Rep>
  Status call(MsgType type, const Req& req, Rep& rep, bool idempotent = true) {
    return retrying([&] { return conn.call(type, req, rep); }, idempotent);
  }
  // A TensorIdsReq of `type` naming `ids` in `pool`, kMaxBatch ids per request; the caller
  // holds mu. No ids: no request, unless `send_empty` (Evict: the whole pool).
  Status call_ids(MsgType type, std::string_view pool, std::span<const uint64_t> ids,
                  bool send_empty = false) {
    wire::TensorIdsReq req{std::string(pool), {}};
    if (ids.empty() && send_empty) return call(type, req, empty);
    for (size_t i = 0; i < ids.size(); i += wire::kMaxBatch) {
      size_t n = std::min<size_t>(wire::kMaxBatch, ids.size() - i);
      std::span<const uint64_t> batch = ids.subspan(i, n);
      req.tensor_ids.assign(batch.begin(), batch.end());
      TIER_TRY(call(type, req, empty));
    }
    return Status::ok();
  }

  Status hello();
  Status reconnect(const Status& why);

  // Maps arena `id` if this connection has not yet. Caller holds mu.
  Result<const client::Arena*> arena(uint64_t id) {
    if (const client::Arena* a = arenas.find(id)) return a;
    wire::MapArenaRep rep;
    int fd = -1;
    Status st = retrying([&] { return conn.call(MsgType::kMapArena, wire::MapArenaReq{id}, rep, &fd); });
    if (!st.is_ok()) return fail(std::move(st));
    if (rep.arena_id != id) {
      if (fd >= 0) ::close(fd);
      return fail(Code::kProtocol, "tierd mapped arena " + std::to_string(rep.arena_id) + " when asked for " +
                                       std::to_string(id));
    }
    return arenas.add(id, fd, rep.size, rep.numa_node);
  }

  // The span a grant names, mapping its arena first if needed. Caller holds mu.
  Result<std::span<std::byte>> span_of(const wire::LeaseGrant& g) {
    auto a = arena(g.arena_id);
    TIER_TRY(a);
    const client::Arena* ar = *a;
    if (g.offset > ar->size || g.length > ar->size - g.offset)
      return fail(Code::kProtocol, "lease of tensor " + std::to_string(g.tensor_id) + " lies outside arena " +
                                       std::to_string(g.arena_id));
    return std::span<std::byte>(ar->base + g.offset, g.length);
  }

  // Best effort: gives back leases the caller will never see (a failure half way through).
  void release_quietly(std::span<const uint64_t> ids) {
    for (size_t i = 0; i < ids.size(); i += wire::kMaxBatch) {
      size_t n = std::min<size_t>(wire::kMaxBatch, ids.size() - i);
      std::span<const uint64_t> batch = ids.subspan(i, n);
      release_req.lease_ids.assign(batch.begin(), batch.end());
      (void)conn.call(MsgType::kRelease, release_req, empty);
    }
  }

  // The id the daemon knows a held lease by (0 when it was lost in a restart).
  uint64_t daemon_id(const Lease& l) noexcept {
    client::HeldLease* h = held.find(l.id_, l.epoch_);
    return h ? h->daemon_id : 0;
  }
  // Stops tracking a lease and detaches it (the caller gives it back another way).
  void forget(Lease& l) noexcept {
    if (client::HeldLease* h = held.find(l.id_, l.epoch_)) held.erase(h);
    l.detach();
  }
  // The error a release of a lost lease returns (and forgets why it was lost).
  Status lost_error(const Lease& l) {
    std::string why;
    if (auto it = lost_why.find({l.id_, l.epoch_}); it != lost_why.end()) {
      why = ": " + it->second;
      lost_why.erase(it);
    }
    return Status(Code::kUnavailable, "lease " + std::to_string(l.id_) + " on tensor " +
                                          std::to_string(l.tensor_id_) + " was lost when tierd restarted" +
                                          why);
  }

  // One attempt (one daemon-side wait of at most timeout_ms); these take mu themselves.
  Result<Lease> lease_once(Client* owner, uint64_t tensor_id, LeaseMode mode, int32_t timeout_ms);
  Result<std::vector<Lease>> lease_batch_once(Client* owner, std::span<const uint64_t> tensor_ids,
                                              LeaseMode mode, int32_t timeout_ms);

  // One lease request for `ids`, granted whole or not at all. Appends to `out`. Caller holds mu.
  Status lease_chunk(std::span<const uint64_t> ids, LeaseMode mode, LeaseWait wait, Client* owner,
                     std::vector<Lease>& out);
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  // Closing the socket makes the daemon release every lease this client still holds; only
  // then is unmapping the arenas safe from the daemon's point of view.
  impl_->conn.close();
  impl_->arenas.unmap_all();
}

const std::string& Client::socket_path() const noexcept { return impl_->path; }

Result<std::unique_ptr<Client>> Client::connect(std::string_view socket_path, const ConnectOptions& opts) {
  try {
    auto impl = std::make_unique<Impl>();
    impl->path = socket_path.empty() ? default_socket_path() : std::string(socket_path);
    impl->opts = opts;
    Status st = impl->conn.open(impl->path, std::max<int64_t>(0, opts.connect_timeout.count()));
    if (!st.is_ok()) return fail(std::move(st));
    st = impl->hello();
    if (!st.is_ok()) return fail(std::move(st));
    impl->lease_req.tensor_ids.reserve(kLeaseChunk);
    impl->lease_rep.grants.reserve(kLeaseChunk);
    impl->release_req.lease_ids.reserve(wire::kMaxBatch);
    return std::unique_ptr<Client>(new Client(std::move(impl)));
  } catch (const std::bad_alloc&) {
    return fail(Code::kResourceExhausted, "out of memory while connecting to tierd");
  }
}

Status Client::Impl::hello() {
  wire::HelloReq req;
  req.pid = static_cast<int32_t>(::getpid());
  req.numa_node = current_numa_node();
  req.client_name = opts.client_name.empty() ? default_client_name() : opts.client_name;
  if (req.client_name.size() > 255) req.client_name.resize(255);
  wire::HelloRep rep;
  TIER_TRY(conn.call(MsgType::kHello, req, rep));
  if (rep.version != wire::kVersion)
    return Status(Code::kProtocol, "tierd speaks protocol version " + std::to_string(rep.version) +
                                       ", this libtier speaks " + std::to_string(wire::kVersion));
  session_id = rep.session_id;
  daemon_version = std::move(rep.daemon_version);
  return Status::ok();
}

// tierd restarted: connect again (backoff), check that every mapped arena is still the same
// shared-memory object, and take back the held leases: write leases are reclaimed (LeaseReclaim:
// the daemon kept them reserved for this client, docs/daemon.md "Leases across a restart"),
// read leases re-acquired (same tensor, mode and bytes). Leases that do not come back at the
// same place (the daemon lost the write lease: timeout, reboot; the tensor is gone, its arena
// was replaced, another client took a conflicting lease first) are lost: forgotten here, named
// with the daemon's reason in the returned error, and their release() reports it too.
Status Client::Impl::reconnect(const Status& why) {
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + opts.reconnect_timeout;
  auto backoff = std::chrono::milliseconds(10);
  Status st;
  for (;;) {
    st = conn.open(path, 0);
    if (st.is_ok()) st = hello();
    if (st.is_ok()) break;
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      conn.close();
      return Status(Code::kUnavailable, why.message() + "; reconnecting gave up after " +
                                            std::to_string(opts.reconnect_timeout.count()) +
                                            " ms: " + st.message());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  ++epoch;
  // Arenas: the same object (a restart) keeps its mapping; another one (a reboot) is remapped.
  std::vector<uint64_t> replaced;
  std::vector<uint64_t> ids;
  for (const auto& a : arenas.all()) ids.push_back(a.id);
  for (uint64_t id : ids) {
    wire::MapArenaRep rep;
    int fd = -1;
    if (!conn.call(MsgType::kMapArena, wire::MapArenaReq{id}, rep, &fd).is_ok()) continue;
    if (arenas.same_object(id, fd)) {
      ::close(fd);
      continue;
    }
    replaced.push_back(id);
    (void)arenas.replace(id, fd, rep.size, rep.numa_node);
  }
  // DMA pins die with the old connection: pin again what is still registered in the same
  // arena object (a replaced arena's registration points at the retired mapping, not at it).
  std::erase_if(dma_pins, [&](const wire::ArenaPinReq& p) {
    return std::ranges::find(replaced, p.arena_id) != replaced.end() ||
           !conn.call(MsgType::kArenaPin, p, empty).is_ok();
  });
  // Leases.
  std::string lost;
  size_t n_lost = 0;
  std::vector<uint64_t> gone;  // held entries to forget: (id, epoch) pairs flattened
  held.for_each([&](client::HeldLease& h) {
    wire::LeaseRep rep;
    Status ls;
    if (h.mode != static_cast<uint8_t>(LeaseMode::kRead)) {
      // A write (or overwrite) lease is reclaimed by the id the old daemon granted, never
      // taken afresh: tierd kept its extent reserved for this client since the restart, so the
      // bytes are exactly what this client stored. A new lease could not vouch for that (the
      // tensor may have been written back, dropped and placed again meanwhile).
      ls = conn.call(MsgType::kLeaseReclaim, wire::LeaseReclaimReq{h.tensor_id, h.daemon_id}, rep);
    } else {
      wire::LeaseReq req;
      req.mode = h.mode;
      req.timeout_ms = 0;
      req.tensor_ids.assign(1, h.tensor_id);
      ls = conn.call(MsgType::kLease, req, rep);
    }
    bool ok = ls.is_ok() && rep.grants.size() == 1;
    bool same_place = ok && rep.grants[0].arena_id == h.arena_id && rep.grants[0].offset == h.offset &&
                      std::find(replaced.begin(), replaced.end(), h.arena_id) == replaced.end();
    if (ok && same_place) {
      h.daemon_id = rep.grants[0].lease_id;
      return;
    }
    if (ok) {
      wire::ReleaseReq rel;
      rel.lease_ids.assign(1, rep.grants[0].lease_id);
      wire::Empty e;
      (void)conn.call(MsgType::kRelease, rel, e);
    }
    std::string why = ls.is_ok() ? std::string("its bytes moved") : ls.message();
    if (n_lost < 8)
      lost += (n_lost ? ", " : "") + std::string("lease ") + std::to_string(h.id) + " on tensor " +
              std::to_string(h.tensor_id) + " (" + why + ")";
    lost_why[{h.id, h.epoch}] = std::move(why);
    ++n_lost;
    gone.push_back(h.id);
    gone.push_back(h.epoch);
  });
  for (size_t i = 0; i < gone.size(); i += 2)
    if (client::HeldLease* h = held.find(gone[i], static_cast<uint32_t>(gone[i + 1]))) held.erase(h);
  if (n_lost > 0)
    return Status(Code::kUnavailable, "tierd restarted; " + std::to_string(n_lost) + " lease" +
                                          (n_lost > 1 ? "s were" : " was") + " lost: " + lost +
                                          (n_lost > 8 ? ", ..." : ""));
  return Status::ok();
}

// ---- pools ----

Result<PoolInfo> Client::create_pool(std::string_view name, const PoolOptions& opts, bool exist_ok) {
  return guarded<Result<PoolInfo>>([&]() -> Result<PoolInfo> {
    if (Status v = validate_pool_name(name); !v.is_ok()) return fail(std::move(v));
    wire::PoolCreateReq req{std::string(name), opts.ram_quota, opts.nvme_quota,
                            exist_ok,          opts.group,     opts.group_read};
    wire::PoolInfoW rep;
    std::lock_guard g(impl_->mu);
    Status st = impl_->call(MsgType::kPoolCreate, req, rep, /*idempotent=*/exist_ok);
    if (!st.is_ok()) return fail(std::move(st));
    return wire::to_public(rep);
  });
}

Result<PoolInfo> Client::open_pool(std::string_view name) {
  return guarded<Result<PoolInfo>>([&]() -> Result<PoolInfo> {
    wire::PoolInfoW rep;
    std::lock_guard g(impl_->mu);
    Status st = impl_->call(MsgType::kPoolOpen, wire::PoolNameReq{std::string(name)}, rep);
    if (!st.is_ok()) return fail(std::move(st));
    return wire::to_public(rep);
  });
}

Result<std::vector<PoolInfo>> Client::list_pools() {
  return guarded<Result<std::vector<PoolInfo>>>([&]() -> Result<std::vector<PoolInfo>> {
    wire::PoolListRep rep;
    {
      std::lock_guard g(impl_->mu);
      Status st = impl_->call(MsgType::kPoolList, wire::Empty{}, rep);
      if (!st.is_ok()) return fail(std::move(st));
    }
    std::vector<PoolInfo> out;
    out.reserve(rep.pools.size());
    for (const auto& p : rep.pools) out.push_back(wire::to_public(p));
    return out;
  });
}

Status Client::drop_pool(std::string_view name) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    return impl_->call(MsgType::kPoolDrop, wire::PoolNameReq{std::string(name)}, impl_->empty, false);
  });
}

// ---- tensors ----

Result<TensorInfo> Client::create_tensor(std::string_view pool, const TensorDesc& desc, bool exist_ok) {
  return guarded<Result<TensorInfo>>([&]() -> Result<TensorInfo> {
    if (Status v = validate_tensor_name(desc.name); !v.is_ok()) return fail(std::move(v));
    wire::TensorCreateReq req;
    req.pool = pool;
    req.name = desc.name;
    req.size = desc.size;
    req.dtype = static_cast<uint8_t>(desc.dtype);
    req.shape = desc.shape;
    req.placement_kind = static_cast<uint8_t>(desc.placement.kind);
    req.placement_index = desc.placement.index;
    req.exist_ok = exist_ok;
    wire::TensorInfoW rep;
    std::lock_guard g(impl_->mu);
    Status st = impl_->call(MsgType::kTensorCreate, req, rep, /*idempotent=*/exist_ok);
    if (!st.is_ok()) return fail(std::move(st));
    return wire::to_public(rep);
  });
}

Result<TensorInfo> Client::open_tensor(std::string_view pool, std::string_view name) {
  return guarded<Result<TensorInfo>>([&]() -> Result<TensorInfo> {
    wire::TensorInfoW rep;
    std::lock_guard g(impl_->mu);
    Status st =
        impl_->call(MsgType::kTensorOpen, wire::TensorRefReq{std::string(pool), std::string(name)}, rep);
    if (!st.is_ok()) return fail(std::move(st));
    return wire::to_public(rep);
  });
}

Result<std::vector<TensorInfo>> Client::list_tensors(std::string_view pool) {
  return guarded<Result<std::vector<TensorInfo>>>([&]() -> Result<std::vector<TensorInfo>> {
    std::vector<TensorInfo> out;
    wire::TensorListReq req{std::string(pool), 0, 0};
    wire::TensorListRep rep;
    for (;;) {
      {
        std::lock_guard g(impl_->mu);
        Status st = impl_->call(MsgType::kTensorList, req, rep);
        if (!st.is_ok()) return fail(std::move(st));
      }
      for (const auto& t : rep.tensors) out.push_back(wire::to_public(t));
      if (!rep.more) return out;
      if (rep.tensors.empty() || rep.tensors.back().id <= req.after_id)
        return fail(Code::kProtocol, "tierd announced another page of tensors but made no progress");
      req.after_id = rep.tensors.back().id;
    }
  });
}

Status Client::delete_tensor(std::string_view pool, std::string_view name) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    return impl_->call(MsgType::kTensorDelete, wire::TensorRefReq{std::string(pool), std::string(name)},
                       impl_->empty, false);
  });
}

// ---- leases ----

// Waiting leases go to the daemon in slices of at most kWaitSliceMs, with the Client's mutex
// dropped between slices. The daemon grants a waiting lease the moment the conflict goes away,
// so slicing adds no latency to a grant; what it buys is that a sibling thread of the same
// Client, which may be the very holder that must release, gets the socket between slices
// instead of deadlocking behind the waiter until its timeout. The cost: a waiter re-queues at
// the daemon every slice, so waiters are not strictly first come, first served.
namespace {

constexpr int32_t kWaitSliceMs = 20;

template <class Attempt> auto with_wait_slices(LeaseWait wait, Attempt attempt)
    -> decltype(attempt(int32_t{0})) {
  if (wait.timeout_ms == 0) return attempt(0);
  const bool forever = wait.timeout_ms < 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, wait.timeout_ms));
  for (;;) {
    int32_t slice = kWaitSliceMs;
    if (!forever) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
              .count();
      slice = static_cast<int32_t>(std::clamp<int64_t>(left, 1, kWaitSliceMs));
    }
    auto r = attempt(slice);
    if (r.has_value() || r.error().code() != Code::kTimeout) return r;
    if (!forever && std::chrono::steady_clock::now() >= deadline) return r;
    // Let a thread blocked on the mutex (maybe the holder, about to release) in first.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

Result<Lease> Client::lease(uint64_t tensor_id, LeaseMode mode, LeaseWait wait) {
  return guarded<Result<Lease>>([&]() -> Result<Lease> {
    return with_wait_slices(wait,
                            [&](int32_t slice) { return impl_->lease_once(this, tensor_id, mode, slice); });
  });
}

Result<Lease> Client::Impl::lease_once(Client* owner, uint64_t tensor_id, LeaseMode mode,
                                       int32_t timeout_ms) {
  std::lock_guard g(mu);
  Impl& m = *this;
  m.lease_req.mode = static_cast<uint8_t>(mode);
  m.lease_req.timeout_ms = timeout_ms;
  m.lease_req.tensor_ids.assign(1, tensor_id);
  Status st = m.call(MsgType::kLease, m.lease_req, m.lease_rep);
  if (!st.is_ok()) return fail(std::move(st));
  if (m.lease_rep.grants.size() != 1 || m.lease_rep.grants[0].tensor_id != tensor_id) {
    for (const auto& gr : m.lease_rep.grants) m.release_quietly({&gr.lease_id, 1});
    return fail(Code::kProtocol, "tierd answered a lease of one tensor with a different grant");
  }
  const wire::LeaseGrant gr = m.lease_rep.grants[0];
  auto span = m.span_of(gr);
  if (!span) {
    m.release_quietly({&gr.lease_id, 1});
    return fail(span.error());
  }
  Lease l;
  l.client_ = owner;
  l.id_ = gr.lease_id;
  l.tensor_id_ = tensor_id;
  l.mode_ = mode;
  l.bytes_ = *span;
  l.epoch_ = m.epoch;
  m.held.insert({gr.lease_id, m.epoch, true, static_cast<uint8_t>(mode), tensor_id, gr.lease_id, gr.arena_id,
                 gr.offset});
  return l;
}

Status Client::Impl::lease_chunk(std::span<const uint64_t> ids, LeaseMode mode, LeaseWait wait, Client* owner,
                                 std::vector<Lease>& out) {
  lease_req.mode = static_cast<uint8_t>(mode);
  lease_req.timeout_ms = wait.timeout_ms;
  lease_req.tensor_ids.assign(ids.begin(), ids.end());
  TIER_TRY(call(MsgType::kLease, lease_req, lease_rep));
  std::vector<uint64_t> granted;
  granted.reserve(lease_rep.grants.size());
  for (const auto& gr : lease_rep.grants) granted.push_back(gr.lease_id);
  if (lease_rep.grants.size() != ids.size()) {
    release_quietly(granted);
    return Status(Code::kProtocol, "tierd granted " + std::to_string(granted.size()) + " of " +
                                       std::to_string(ids.size()) + " leases in a batch");
  }
  const std::vector<wire::LeaseGrant> grants = lease_rep.grants;  // span_of reuses the connection
  size_t first = out.size();
  for (size_t i = 0; i < grants.size(); ++i) {
    const auto& gr = grants[i];
    Result<std::span<std::byte>> span =
        gr.tensor_id == ids[i] ? span_of(gr)
                               : fail(Code::kProtocol, "tierd granted a batch out of request order");
    if (!span) {
      for (size_t j = first; j < out.size(); ++j) forget(out[j]);
      out.resize(first);
      release_quietly(granted);
      return span.error();
    }
    Lease l;
    l.client_ = owner;
    l.id_ = gr.lease_id;
    l.tensor_id_ = gr.tensor_id;
    l.mode_ = mode;
    l.bytes_ = *span;
    l.epoch_ = epoch;
    held.insert({gr.lease_id, epoch, true, static_cast<uint8_t>(mode), gr.tensor_id, gr.lease_id, gr.arena_id,
                 gr.offset});
    out.push_back(std::move(l));
  }
  return Status::ok();
}

Result<std::vector<Lease>> Client::lease_batch(std::span<const uint64_t> tensor_ids, LeaseMode mode,
                                               LeaseWait wait) {
  return guarded<Result<std::vector<Lease>>>([&]() -> Result<std::vector<Lease>> {
    return with_wait_slices(
        wait, [&](int32_t slice) { return impl_->lease_batch_once(this, tensor_ids, mode, slice); });
  });
}

Result<std::vector<Lease>> Client::Impl::lease_batch_once(Client* owner, std::span<const uint64_t> tensor_ids,
                                                          LeaseMode mode, int32_t timeout_ms) {
  const LeaseWait wait{timeout_ms};
  std::vector<Lease> out;
  if (tensor_ids.empty()) return out;
  out.reserve(tensor_ids.size());
  std::lock_guard g(mu);
  // Batches above one reply's worth go as several requests; a failure in a later one gives back
  // what the earlier ones got, so the caller still sees all or nothing.
  for (size_t i = 0; i < tensor_ids.size(); i += kLeaseChunk) {
    size_t n = std::min(kLeaseChunk, tensor_ids.size() - i);
    Status st = lease_chunk(tensor_ids.subspan(i, n), mode, wait, owner, out);
    if (!st.is_ok()) {
      std::vector<uint64_t> ids;
      ids.reserve(out.size());
      for (Lease& l : out) {
        ids.push_back(daemon_id(l));
        forget(l);
      }
      release_quietly(ids);
      return fail(std::move(st));
    }
  }
  return out;
}

Status Client::release_one(const Lease& lease) {
  std::lock_guard g(impl_->mu);
  Impl& m = *impl_;
  // Looked up per attempt: a reconnect in between re-acquires it under a new daemon id.
  auto attempt = [&] {
    client::HeldLease* h = m.held.find(lease.id_, lease.epoch_);
    if (!h) return m.lost_error(lease);
    m.release_req.lease_ids.assign(1, h->daemon_id);
    return m.conn.call(MsgType::kRelease, m.release_req, m.empty);
  };
  Status st = attempt();
  if (!st.is_ok() && st.code() == Code::kUnavailable && !m.conn.is_open() &&
      m.opts.reconnect_timeout.count() > 0) {
    // tierd restarted. The answer is this lease's own: released under the id the reconnect
    // got back for it, or lost (and why), whatever happened to the other leases (their own
    // releases report those).
    Status rs = m.reconnect(st);
    st = m.conn.is_open() ? attempt() : rs;
  }
  if (client::HeldLease* h = m.held.find(lease.id_, lease.epoch_)) {
    // Released, or the connection is gone for good (the daemon drops a dead client's leases).
    if (st.is_ok() || !m.conn.is_open()) m.held.erase(h);
  }
  return st;
}

Status Client::release_batch(std::span<Lease> leases) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    Impl& m = *impl_;
    Status result;
    auto note = [&](Status st) {
      if (result.is_ok() && !st.is_ok()) result = std::move(st);
    };
    // The leases of the request being built. They stay in `held` until it is answered: if
    // tierd restarted, the reconnect takes them back under new ids (or names the lost ones)
    // and they are released under those; a lease the daemon cannot vouch for is reported.
    std::vector<Lease*> batch;
    batch.reserve(std::min<size_t>(leases.size(), wire::kMaxBatch));
    auto send = [&] {
      m.release_req.lease_ids.clear();
      for (Lease* l : batch)
        if (client::HeldLease* h = m.held.find(l->id_, l->epoch_))
          m.release_req.lease_ids.push_back(h->daemon_id);
      if (m.release_req.lease_ids.empty()) return Status::ok();
      return m.conn.call(MsgType::kRelease, m.release_req, m.empty);
    };
    auto flush = [&] {
      if (batch.empty()) return;
      Status st = send();
      if (!st.is_ok() && !m.conn.is_open() && m.opts.reconnect_timeout.count() > 0) {
        Status rs = m.reconnect(st);
        st = m.conn.is_open() ? send() : rs;
      }
      for (Lease* l : batch) {
        if (client::HeldLease* h = m.held.find(l->id_, l->epoch_)) m.held.erase(h);
        else note(m.lost_error(*l));
        l->detach();
      }
      note(std::move(st));
      batch.clear();
    };
    for (Lease& l : leases) {
      if (!l.valid()) continue;
      if (l.client_ != this) {
        note(Status(Code::kInvalidArgument, "release_batch given a lease of another client"));
        continue;
      }
      if (!m.held.find(l.id_, l.epoch_)) {
        note(m.lost_error(l));
        l.detach();
        continue;
      }
      batch.push_back(&l);
      if (batch.size() == wire::kMaxBatch) flush();
    }
    flush();
    return result;
  });
}

// ---- tiering ----

Status Client::prefetch(std::string_view pool, std::span<const uint64_t> tensor_ids) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    return impl_->call_ids(MsgType::kPrefetch, pool, tensor_ids);
  });
}

Status Client::discard(std::string_view pool, std::span<const uint64_t> tensor_ids) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    return impl_->call_ids(MsgType::kDiscard, pool, tensor_ids);
  });
}

Status Client::evict(std::string_view pool, std::span<const uint64_t> tensor_ids) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    return impl_->call_ids(MsgType::kEvict, pool, tensor_ids, /*send_empty=*/true);
  });
}

Status Client::set_plan(std::string_view pool, std::span<const uint64_t> tensor_ids, uint64_t budget) {
  return guarded<Status>([&]() -> Status {
    wire::PlanSetReq req{std::string(pool), {tensor_ids.begin(), tensor_ids.end()}, budget, {}};
    std::lock_guard g(impl_->mu);
    return impl_->call(MsgType::kPlanSet, req, impl_->empty);
  });
}

Status Client::set_plan(std::string_view pool, std::span<const PlanUse> uses, uint64_t budget) {
  return guarded<Status>([&]() -> Status {
    wire::PlanSetReq req{std::string(pool), {}, budget, {}};
    req.tensor_ids.reserve(uses.size());
    req.overwrite.reserve(uses.size());
    for (const PlanUse& u : uses) {
      req.tensor_ids.push_back(u.tensor_id);
      req.overwrite.push_back(u.overwrite ? 1 : 0);
    }
    std::lock_guard g(impl_->mu);
    return impl_->call(MsgType::kPlanSet, req, impl_->empty);
  });
}

Result<SnapshotInfo> Client::snapshot(std::string_view pool) {
  return guarded<Result<SnapshotInfo>>([&]() -> Result<SnapshotInfo> {
    wire::SnapshotRep rep;
    std::lock_guard g(impl_->mu);
    Status st = impl_->call(MsgType::kSnapshot, wire::PoolNameReq{std::string(pool)}, rep);
    if (!st.is_ok()) return fail(std::move(st));
    return SnapshotInfo{rep.snapshot_id, rep.bytes, rep.stall_us};
  });
}

Result<SnapshotInfo> Client::snapshot(std::string_view pool, const SnapshotOptions& opts) {
  return guarded<Result<SnapshotInfo>>([&]() -> Result<SnapshotInfo> {
    wire::SnapshotRep rep;
    std::lock_guard g(impl_->mu);
    Status st = impl_->call(MsgType::kSnapshotTake,
                            wire::SnapshotTakeReq{std::string(pool), opts.tag, opts.keep}, rep);
    if (!st.is_ok()) return fail(std::move(st));
    return SnapshotInfo{rep.snapshot_id, rep.bytes, rep.stall_us};
  });
}

Result<PoolSnapshots> Client::list_snapshots(std::string_view pool) {
  return guarded<Result<PoolSnapshots>>([&]() -> Result<PoolSnapshots> {
    wire::SnapshotListRep rep;
    std::lock_guard g(impl_->mu);
    Status st = impl_->call(MsgType::kSnapshotList, wire::PoolNameReq{std::string(pool)}, rep);
    if (!st.is_ok()) return fail(std::move(st));
    PoolSnapshots out{rep.recovered, rep.recovered_from, rep.lost, {}};
    for (const auto& w : rep.snapshots) out.snapshots.push_back(SnapshotEntry{w.snapshot_id, w.tag, w.bytes});
    return out;
  });
}

Result<RestoreInfo> Client::restore_snapshot(std::string_view pool, uint64_t snapshot_id) {
  return guarded<Result<RestoreInfo>>([&]() -> Result<RestoreInfo> {
    wire::SnapshotRestoreRep rep;
    std::lock_guard g(impl_->mu);
    Status st =
        impl_->call(MsgType::kSnapshotRestore, wire::SnapshotRestoreReq{std::string(pool), snapshot_id}, rep);
    if (!st.is_ok()) return fail(std::move(st));
    return RestoreInfo{rep.tensors, rep.bytes, rep.deleted, rep.dropped_snapshots};
  });
}

// ---- inspection ----

Result<NodeStatus> Client::status() {
  return guarded<Result<NodeStatus>>([&]() -> Result<NodeStatus> {
    wire::StatusRep rep;
    {
      std::lock_guard g(impl_->mu);
      Status st = impl_->call(MsgType::kStatus, wire::Empty{}, rep);
      if (!st.is_ok()) return fail(std::move(st));
    }
    NodeStatus s;
    s.daemon_version = std::move(rep.daemon_version);
    s.uptime_ms = rep.uptime_ms;
    s.clients = rep.clients;
    s.pools = rep.pools;
    s.leases = rep.leases;
    for (const auto& r : rep.ram) s.ram.push_back({r.node, r.capacity, r.used, r.dirty, r.tensors});
    for (const auto& n : rep.nvme) s.nvme.push_back({n.path, n.numa_node, n.backend, n.capacity, n.used});
    wire::copy_counters(s, rep);
    return s;
  });
}

Result<Topology> Client::topology() {
  return guarded<Result<Topology>>([&]() -> Result<Topology> {
    wire::TopoRep rep;
    {
      std::lock_guard g(impl_->mu);
      Status st = impl_->call(MsgType::kTopo, wire::Empty{}, rep);
      if (!st.is_ok()) return fail(std::move(st));
    }
    Topology t;
    t.source = std::move(rep.source);
    for (const auto& n : rep.nodes) t.nodes.push_back({n.id, n.memory, n.cpus});
    for (const auto& d : rep.gpus) t.gpus.push_back({d.index, d.name, d.pci, d.numa_node});
    for (const auto& d : rep.nvme) t.nvme.push_back({d.index, d.name, d.pci, d.numa_node});
    return t;
  });
}

Result<std::string> Client::metrics() {
  return guarded<Result<std::string>>([&]() -> Result<std::string> {
    // The text comes in pages of at most 4 KiB (the wire's string limit), cut at line ends.
    std::string text;
    std::lock_guard g(impl_->mu);
    for (uint32_t page = 0; page < 65536; ++page) {
      wire::TextRep rep;
      Status st = impl_->call(MsgType::kMetrics, wire::MetricsReq{page}, rep);
      if (!st.is_ok()) return fail(std::move(st));
      text += rep.text;
      if (!rep.more) break;
    }
    return text;
  });
}

std::vector<Client::ArenaMapping> Client::mapped_arenas() const {
  return guarded<std::vector<Client::ArenaMapping>>([&]() -> std::vector<Client::ArenaMapping> {
    std::lock_guard g(impl_->mu);
    std::vector<ArenaMapping> out;
    for (const auto& a : impl_->arenas.all()) out.push_back({a.id, a.base, a.size, a.numa_node, a.read_only});
    return out;
  });
}

Status Client::pin_for_dma(std::span<const std::byte> range, bool pinned) {
  return guarded<Status>([&]() -> Status {
    std::lock_guard g(impl_->mu);
    const auto p = reinterpret_cast<uintptr_t>(range.data());
    for (const auto& a : impl_->arenas.all()) {
      const auto base = reinterpret_cast<uintptr_t>(a.base);
      if (range.empty() || p < base || p - base > a.size || range.size() > a.size - (p - base)) continue;
      wire::ArenaPinReq req{a.id, p - base, range.size(), true};
      TIER_TRY(impl_->call(MsgType::kArenaPin,
                           wire::ArenaPinReq{req.arena_id, req.offset, req.length, pinned}, impl_->empty));
      auto& pins = impl_->dma_pins;
      if (pinned) {
        pins.push_back(req);
      } else if (auto it = std::ranges::find_if(pins,
                                                [&](const wire::ArenaPinReq& q) {
                                                  return q.arena_id == req.arena_id &&
                                                         q.offset == req.offset && q.length == req.length;
                                                });
                 it != pins.end()) {
        pins.erase(it);
      }
      return Status::ok();
    }
    return Status(Code::kNotFound, "pin_for_dma: the range is not inside one mapped arena");
  });
}

// ---- Lease ----

Lease::Lease(Lease&& o) noexcept
    : client_(std::exchange(o.client_, nullptr)),
      id_(o.id_),
      tensor_id_(o.tensor_id_),
      mode_(o.mode_),
      bytes_(std::exchange(o.bytes_, {})),
      epoch_(o.epoch_) {}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    (void)release();
    client_ = std::exchange(o.client_, nullptr);
    id_ = o.id_;
    tensor_id_ = o.tensor_id_;
    mode_ = o.mode_;
    bytes_ = std::exchange(o.bytes_, {});
    epoch_ = o.epoch_;
  }
  return *this;
}

Lease::~Lease() { (void)release(); }

Status Lease::release() {
  if (!client_) return Status::ok();
  Client* c = std::exchange(client_, nullptr);
  bytes_ = {};
  try {
    return c->release_one(*this);
  } catch (...) {  // a destructor must not throw; a failed release dies with the connection
    return Status(Code::kInternal, "release failed with an exception");
  }
}

}  // namespace tier
