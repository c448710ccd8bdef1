// tier-bench rpc: control-plane latency and batched lease throughput vs a raw socket.
//
// Figures (all measured against one tierd, interleaved in blocks with their baseline):
//   rpc.lease          us        latency of one Client::lease() of one tensor (read, fail fast):
//                                encode, send, the daemon's work, reply, decode, span lookup.
//                                The release after it runs untimed.
//   rpc.lease_release  us        one lease() + release() cycle (two round trips).
//   rpc.lease_batch    leases/s  lease_batch() of 256 tensors + release_batch(), as 256 / cycle.
// Baseline: a raw SOCK_SEQPACKET ping-pong with a peer process (socketpair + fork) that answers
// each datagram at once with a reply of the requested size. Every baseline round trip uses the
// exact datagram sizes of the protocol messages it stands for (lease request and reply, release
// request and reply), so the baseline is "the same bytes through the same kind of socket, with
// nothing done on either side". Latency values are medians of per-operation times; ratio is
// value / baseline (targets: rpc.lease <= 1.3; rpc.lease_batch >= 200k leases/s absolute).
//
// Placement matters more than anything else here: on a VM, waking a process on another, idle
// CPU costs tens of microseconds more than waking it on the CPU that sent the message, and the
// scheduler's choice between the two differs from run to run. So with a private tierd, both
// pairs are pinned alike and measured twice:
//   rpc.*            client, tierd and raw peer on one CPU (the ping-pong never leaves it)
//   rpc.*.cross_cpu  client on one CPU; tierd and the raw peer together on another
// With --socket (a tierd this process does not own) nothing is pinned and only rpc.* is
// emitted: client, tierd and peer placed as the scheduler decides.
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "bench_common.hpp"
#include "tier/client.hpp"
#include "wire/messages.hpp"
#include "base/errors.hpp"

namespace tier::bench {

namespace {

constexpr size_t kBatch = 256;

// Datagram sizes of the real protocol messages, taken from the codec itself.
struct MsgSizes {
  size_t lease_req, lease_rep, release_req, release_rep;
};

MsgSizes sizes_for(size_t n) {
  std::vector<std::byte> buf;
  MsgSizes s{};
  wire::LeaseReq lr;
  lr.tensor_ids.assign(n, 1);
  (void)wire::encode(10, 1, lr, buf);
  s.lease_req = buf.size();
  wire::LeaseRep rep;
  rep.grants.assign(n, wire::LeaseGrant{});
  (void)wire::encode_reply(10, 1, Status::ok(), rep, buf);
  s.lease_rep = buf.size();
  wire::ReleaseReq rr;
  rr.lease_ids.assign(n, 1);
  (void)wire::encode(11, 1, rr, buf);
  s.release_req = buf.size();
  (void)wire::encode_reply(11, 1, Status::ok(), wire::Empty{}, buf);
  s.release_rep = buf.size();
  return s;
}

// The raw peer: answers every datagram with one of the size named in its first 4 bytes.
[[noreturn]] void echo_peer(int fd) {
  static std::byte in[wire::kMaxMessageBytes], out[wire::kMaxMessageBytes];
  for (;;) {
    ssize_t n = ::recv(fd, in, sizeof in, 0);
    if (n <= 0) _exit(0);
    uint32_t want = 0;
    std::memcpy(&want, in, sizeof want);
    if (want > sizeof out) want = sizeof out;
    if (::send(fd, out, want, MSG_NOSIGNAL) < 0) _exit(0);
  }
}

class RawPeer {
 public:
  bool start() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return false;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      ::close(sv[0]);
      echo_peer(sv[1]);
    }
    ::close(sv[1]);
    fd_ = sv[0];
    return true;
  }
  pid_t pid() const { return pid_; }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);  // the peer exits on EOF
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  // One round trip: `req` bytes out, a `rep`-byte datagram back.
  bool round_trip(size_t req, size_t rep) {
    uint32_t want = static_cast<uint32_t>(rep);
    std::memcpy(out_, &want, sizeof want);
    if (::send(fd_, out_, req, MSG_NOSIGNAL) != static_cast<ssize_t>(req)) return false;
    return ::recv(fd_, in_, sizeof in_, 0) == static_cast<ssize_t>(rep);
  }

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  std::byte out_[wire::kMaxMessageBytes]{}, in_[wire::kMaxMessageBytes]{};
};

int fail_msg(const std::string& what, const Status& st) {
  std::fprintf(stderr, "tier-bench rpc: %s: %s\n", what.c_str(), st.to_string().c_str());
  return 1;
}

struct Placement {
  std::string suffix;
  int client_cpu = -1, server_cpu = -1;  // -1: not pinned
};

}  // namespace

namespace {

struct RpcContext {
  const BenchOptions& o;
  Client& c;
  RawPeer& peer;
  const std::vector<uint64_t>& ids;
  int ops, batch_cycles, block;
};

int measure(const RpcContext& x, const std::string& suffix) {
  const BenchOptions& o = x.o;
  Client& c = x.c;
  RawPeer* peer = &x.peer;
  const std::vector<uint64_t>& ids = x.ids;
  const int ops = x.ops, batch_cycles = x.batch_cycles, block = x.block;
  const MsgSizes one = sizes_for(1), many = sizes_for(kBatch);
  // --- single lease: per-op times, blocks alternating between daemon and raw peer ---
  std::vector<double> lease_us, cycle_us, raw_lease_us, raw_cycle_us;
  lease_us.reserve(ops);
  cycle_us.reserve(ops);
  raw_lease_us.reserve(ops);
  raw_cycle_us.reserve(ops);
  auto tierd_block = [&](int n, bool record) -> Status {
    for (int i = 0; i < n; ++i) {
      uint64_t t0 = now_ns();
      auto l = c.lease(ids[0], LeaseMode::kRead);
      uint64_t t1 = now_ns();
      TIER_TRY(l);
      TIER_TRY(l->release());
      uint64_t t2 = now_ns();
      if (record) {
        lease_us.push_back((t1 - t0) / 1e3);
        cycle_us.push_back((t2 - t0) / 1e3);
      }
    }
    return Status::ok();
  };
  auto raw_block = [&](int n, bool record) {
    for (int i = 0; i < n; ++i) {
      uint64_t t0 = now_ns();
      bool ok = peer->round_trip(one.lease_req, one.lease_rep);
      uint64_t t1 = now_ns();
      ok = ok && peer->round_trip(one.release_req, one.release_rep);
      uint64_t t2 = now_ns();
      if (!ok) return false;
      if (record) {
        raw_lease_us.push_back((t1 - t0) / 1e3);
        raw_cycle_us.push_back((t2 - t0) / 1e3);
      }
    }
    return true;
  };
  if (Status st = tierd_block(200, false); !st.is_ok()) return fail_msg("lease warm-up", st);
  if (!raw_block(200, false)) return fail_msg("raw warm-up", Status::from_errno(errno, "round trip"));
  for (int done = 0, k = 0; done < ops; done += block, ++k) {
    int n = std::min(block, ops - done);
    bool raw_first = k % 2 == 1;
    if (raw_first && !raw_block(n, true))
      return fail_msg("raw round trip", Status::from_errno(errno, "round trip"));
    if (Status st = tierd_block(n, true); !st.is_ok()) return fail_msg("lease", st);
    if (!raw_first && !raw_block(n, true))
      return fail_msg("raw round trip", Status::from_errno(errno, "round trip"));
  }
  double v = median(lease_us), b = median(raw_lease_us);
  emit(o, {"rpc.lease" + suffix, std::nullopt, v, "us", b, b > 0 ? v / b : 0});
  v = median(cycle_us), b = median(raw_cycle_us);
  emit(o, {"rpc.lease_release" + suffix, std::nullopt, v, "us", b, b > 0 ? v / b : 0});

  // --- batched leases: lease_batch(256) + release_batch per cycle ---
  std::vector<double> batch_s, raw_batch_s;
  Status err;
  auto batch_once = [&] {
    uint64_t t0 = now_ns();
    auto ls = c.lease_batch(ids, LeaseMode::kRead);
    if (!ls) {
      err = ls.error();
      return false;
    }
    if (Status st = c.release_batch(*ls); !st.is_ok()) {
      err = st;
      return false;
    }
    batch_s.push_back((now_ns() - t0) / 1e9);
    return true;
  };
  auto raw_batch_once = [&] {
    uint64_t t0 = now_ns();
    if (!peer->round_trip(many.lease_req, many.lease_rep) ||
        !peer->round_trip(many.release_req, many.release_rep)) {
      err = Status::from_errno(errno, "raw round trip");
      return false;
    }
    raw_batch_s.push_back((now_ns() - t0) / 1e9);
    return true;
  };
  for (int i = 0; i < batch_cycles; ++i) {
    bool ok = i % 2 ? raw_batch_once() && batch_once() : batch_once() && raw_batch_once();
    if (!ok) return fail_msg("batched lease", err);
  }
  double bt = median(batch_s), rbt = median(raw_batch_s);
  v = bt > 0 ? kBatch / bt : 0;
  b = rbt > 0 ? kBatch / rbt : 0;
  emit(o, {"rpc.lease_batch" + suffix, std::nullopt, v, "leases/s", b, b > 0 ? v / b : 0});

  return 0;
}

}  // namespace

int run_rpc(const BenchOptions& o) {
  const int ops = o.quick ? 2000 : 20000;  // single-lease operations per side
  const int batch_cycles = o.quick ? 100 : 2000;
  const int block = o.quick ? 250 : 1000;  // interleaving granularity

  auto peer = std::make_unique<RawPeer>();  // large buffers: keep them off the stack
  if (!peer->start()) {
    std::fprintf(stderr, "tier-bench rpc: cannot start the raw socket peer: %s\n", std::strerror(errno));
    return 1;
  }
  BenchDaemon daemon;
  if (!daemon.start(o, "256M")) return 1;
  auto client = Client::connect(daemon.socket(), {.client_name = "tier-bench"});
  if (!client) return fail_msg("connect to " + daemon.socket(), client.error());
  Client& c = **client;
  std::string pool = bench_pool_name("rpc");
  // 4 KiB tensors (below tierd's large-extent alignment, so they pack at page granularity).
  auto p = c.create_pool(pool, {.ram_quota = 16ull << 20});
  if (!p) return fail_msg("create pool " + pool, p.error());
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < kBatch; ++i) {
    auto t =
        c.create_tensor(pool, {.name = "t" + std::to_string(i), .size = 4096, .shape = {}, .placement = {}});
    if (!t) return fail_msg("create tensor", t.error());
    ids.push_back(t->id);
  }
  RpcContext ctx{o, c, *peer, ids, ops, batch_cycles, block};
  std::vector<Placement> placements;
  const std::vector<int> cpus = daemon.is_private() ? allowed_cpus() : std::vector<int>{};
  if (cpus.empty()) {
    placements.push_back({"", -1, -1});
  } else {
    placements.push_back({"", cpus[0], cpus[0]});
    if (cpus.size() > 1) placements.push_back({".cross_cpu", cpus[0], cpus[1]});
  }
  int rc = 0;
  for (const Placement& pl : placements) {
    if (pl.client_cpu >= 0 && !(pin(0, pl.client_cpu) && pin_process(peer->pid(), pl.server_cpu) &&
                                pin_process(daemon.pid(), pl.server_cpu))) {
      std::fprintf(stderr, "tier-bench rpc: sched_setaffinity: %s\n", std::strerror(errno));
      rc = 1;
      break;
    }
    if ((rc = measure(ctx, pl.suffix)) != 0) break;
  }
  unpin_self(cpus);
  if (Status st = c.drop_pool(pool); !st.is_ok() && rc == 0) return fail_msg("drop pool", st);
  return rc;
}

}  // namespace tier::bench
