// tier-bench load: many concurrent clients against one tierd for a fixed time (issue 7).
//
// Each of --clients threads owns one tier::Client (its own connection) and one pool, and runs a
// mixed workload until --seconds pass: create a tensor, lease it (read or write, fail fast) and
// release it, prefetch (kUnsupported without an NVMe tier is expected and not an error), delete a
// tensor. Clients never touch each other's pools, so a correct daemon answers every call with
// success: any other answer is an error, counted and printed, and makes the suite exit 1.
//
// Figures:
//   load.ops            ops/s   every client call (create, lease, release, prefetch, delete)
//                               vs raw round trips/s of the same number of clients ping-ponging
//                               lease-sized datagrams with a single-threaded epoll echo server
//                               (what a daemon that does no work would sustain), measured right
//                               after the load phase for a quarter of its duration.
//   load.lease.p50/p99/p999 us  lease latency under load vs the raw round-trip percentiles of
//                               that baseline phase.
//   load.errors         count   baseline = value, ratio 1 (no baseline applies; must be 0).
//   load.daemon_rss     KiB     tierd's VmRSS after the run vs before it (ratio = growth).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "tier/client.hpp"
#include "wire/messages.hpp"

namespace tier::bench {

namespace {

struct ClientResult {
  uint64_t ops = 0, errors = 0;
  std::vector<double> lease_us;
  std::string first_error;
};

void note(ClientResult& r, const std::string& what, const Status& st) {
  r.errors++;
  if (r.first_error.empty()) r.first_error = what + ": " + st.to_string();
}

void client_loop(const std::string& socket, int idx, uint64_t deadline_ns, std::atomic<int>& ready,
                 ClientResult& r) {
  auto c = Client::connect(socket, {.client_name = "tier-bench-load"});
  if (!c) {
    note(r, "connect", c.error());
    ready++;
    return;
  }
  Client& cl = **c;
  std::string pool = bench_pool_name("load") + "-c" + std::to_string(idx);
  auto p = cl.create_pool(pool, {.ram_quota = 8ull << 20});
  ready++;
  if (!p) return note(r, "create_pool", p.error());
  std::mt19937_64 rng(static_cast<uint64_t>(idx) * 7919 + 1);
  struct T {
    std::string name;
    uint64_t id;
  };
  std::vector<T> tensors;
  uint64_t next = 0;
  r.lease_us.reserve(1 << 16);
  auto create = [&] {
    std::string name = "t" + std::to_string(next++);
    uint64_t size = 4096ull << (rng() % 5);  // 4..64 KiB
    auto t = cl.create_tensor(pool, {.name = name, .size = size, .shape = {}, .placement = {}});
    r.ops++;
    if (!t) return note(r, "create_tensor", t.error());
    tensors.push_back({name, t->id});
  };
  for (int i = 0; i < 4; ++i) create();
  while (now_ns() < deadline_ns) {
    unsigned k = static_cast<unsigned>(rng() % 100);
    if (k < 10 && tensors.size() < 64) {
      create();
    } else if (k < 15 && tensors.size() > 4) {
      size_t i = rng() % tensors.size();
      Status st = cl.delete_tensor(pool, tensors[i].name);
      r.ops++;
      if (!st.is_ok()) note(r, "delete_tensor", st);
      tensors[i] = tensors.back();
      tensors.pop_back();
    } else if (k < 25 && !tensors.empty()) {
      uint64_t id = tensors[rng() % tensors.size()].id;
      Status st = cl.prefetch(pool, std::span<const uint64_t>(&id, 1));
      r.ops++;
      if (!st.is_ok() && st.code() != Code::kUnsupported) note(r, "prefetch", st);
    } else if (!tensors.empty()) {
      uint64_t id = tensors[rng() % tensors.size()].id;
      LeaseMode mode = rng() % 4 == 0 ? LeaseMode::kWrite : LeaseMode::kRead;
      uint64_t t0 = now_ns();
      auto l = cl.lease(id, mode);
      uint64_t t1 = now_ns();
      r.ops++;
      if (!l) {
        note(r, "lease", l.error());
        continue;
      }
      r.lease_us.push_back(static_cast<double>(t1 - t0) / 1e3);
      if (!l->bytes().empty()) l->bytes()[0] = std::byte{1};  // touch: the mapping is real
      Status st = l->release();
      r.ops++;
      if (!st.is_ok()) note(r, "release", st);
    }
  }
  Status st = cl.drop_pool(pool);
  if (!st.is_ok()) note(r, "drop_pool", st);
}

// The baseline server: one thread, epoll over every client socket, answers each datagram at
// once with a reply of the size named in its first 4 bytes — tierd's shape with no work.
[[noreturn]] void echo_server(std::vector<int> fds) {
  static std::byte in[wire::kMaxMessageBytes], out[wire::kMaxMessageBytes];
  int ep = ::epoll_create1(0);
  for (int fd : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }
  size_t open = fds.size();
  epoll_event evs[64];
  while (open > 0) {
    int n = ::epoll_wait(ep, evs, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      ssize_t got = ::recv(fd, in, sizeof in, MSG_DONTWAIT);
      if (got <= 0) {
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        --open;
        continue;
      }
      uint32_t want = 0;
      std::memcpy(&want, in, sizeof want);
      if (want > sizeof out) want = sizeof out;
      (void)::send(fd, out, want, MSG_NOSIGNAL);
    }
  }
  _exit(0);
}

struct RawResult {
  uint64_t trips = 0;
  std::vector<double> us;
  bool ok = true;
};

// N threads, each a ping-pong with the echo server over its own socketpair, until the deadline.
bool raw_baseline(int n, double seconds, size_t req, size_t rep, std::vector<RawResult>& res) {
  std::vector<int> mine, theirs;
  for (int i = 0; i < n; ++i) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return false;
    mine.push_back(sv[0]);
    theirs.push_back(sv[1]);
  }
  pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    for (int fd : mine) ::close(fd);
    echo_server(theirs);
  }
  for (int fd : theirs) ::close(fd);
  res.assign(static_cast<size_t>(n), {});
  uint64_t deadline = now_ns() + static_cast<uint64_t>(seconds * 1e9);
  std::vector<std::thread> th;
  for (int i = 0; i < n; ++i)
    th.emplace_back([&, i] {
      RawResult& r = res[static_cast<size_t>(i)];
      std::vector<std::byte> out(req), in(wire::kMaxMessageBytes);
      uint32_t want = static_cast<uint32_t>(rep);
      std::memcpy(out.data(), &want, sizeof want);
      r.us.reserve(1 << 16);
      while (now_ns() < deadline) {
        uint64_t t0 = now_ns();
        if (::send(mine[static_cast<size_t>(i)], out.data(), req, MSG_NOSIGNAL) !=
                static_cast<ssize_t>(req) ||
            ::recv(mine[static_cast<size_t>(i)], in.data(), in.size(), 0) != static_cast<ssize_t>(rep)) {
          r.ok = false;
          return;
        }
        r.us.push_back(static_cast<double>(now_ns() - t0) / 1e3);
        r.trips++;
      }
    });
  for (auto& t : th) t.join();
  for (int fd : mine) ::close(fd);
  ::waitpid(pid, nullptr, 0);
  return std::all_of(res.begin(), res.end(), [](const RawResult& r) { return r.ok; });
}

}  // namespace

int run_load(const BenchOptions& o) {
  const int n = o.clients;
  BenchDaemon daemon;
  if (!daemon.start(o, "2G")) return 1;
  pid_t dpid = daemon_pid(daemon.socket());
  double rss_before = proc_status_kib(dpid, "VmRSS");

  std::vector<ClientResult> results(static_cast<size_t>(n));
  std::atomic<int> ready{0};
  uint64_t t0 = now_ns();
  uint64_t deadline = t0 + static_cast<uint64_t>(o.seconds * 1e9);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    threads.emplace_back(client_loop, daemon.socket(), i, deadline, std::ref(ready),
                         std::ref(results[static_cast<size_t>(i)]));
  for (auto& t : threads) t.join();
  double elapsed = static_cast<double>(now_ns() - t0) / 1e9;
  double rss_after = proc_status_kib(dpid, "VmRSS");

  uint64_t ops = 0, errors = 0;
  std::vector<double> lat;
  for (auto& r : results) {
    ops += r.ops;
    errors += r.errors;
    lat.insert(lat.end(), r.lease_us.begin(), r.lease_us.end());
    if (!r.first_error.empty()) std::fprintf(stderr, "tier-bench load: %s\n", r.first_error.c_str());
  }

  // Baseline: same concurrency, lease-sized datagrams, an echo server that does nothing.
  std::vector<std::byte> buf;
  wire::LeaseReq lr;
  lr.tensor_ids.assign(1, 1);
  (void)wire::encode(static_cast<uint16_t>(wire::MsgType::kLease), 1, lr, buf);
  size_t req = buf.size();
  wire::LeaseRep rep;
  rep.grants.assign(1, wire::LeaseGrant{});
  (void)wire::encode_reply(static_cast<uint16_t>(wire::MsgType::kLease), 1, Status::ok(), rep, buf);
  size_t repsz = buf.size();
  double raw_seconds = std::max(0.5, o.seconds / 4);
  std::vector<RawResult> raw;
  if (!raw_baseline(n, raw_seconds, req, repsz, raw)) {
    std::fprintf(stderr, "tier-bench load: raw socket baseline failed: %s\n", std::strerror(errno));
    return 1;
  }
  uint64_t trips = 0;
  std::vector<double> raw_lat;
  for (auto& r : raw) {
    trips += r.trips;
    raw_lat.insert(raw_lat.end(), r.us.begin(), r.us.end());
  }

  auto ratio = [](double v, double b) { return b > 0 ? v / b : 0; };
  double ops_s = static_cast<double>(ops) / elapsed, raw_s = static_cast<double>(trips) / raw_seconds;
  emit(o, {"load.ops", std::nullopt, ops_s, "ops/s", raw_s, ratio(ops_s, raw_s)});
  for (auto [name, q] :
       {std::pair{"load.lease.p50", 0.5}, {"load.lease.p99", 0.99}, {"load.lease.p999", 0.999}}) {
    double v = quantile(lat, q), b = quantile(raw_lat, q);
    emit(o, {name, std::nullopt, v, "us", b, ratio(v, b)});
  }
  emit(o,
       {"load.errors", std::nullopt, static_cast<double>(errors), "errors", static_cast<double>(errors), 1});
  emit(o, {"load.daemon_rss", std::nullopt, rss_after, "KiB", rss_before, ratio(rss_after, rss_before)});
  if (errors > 0) {
    std::fprintf(stderr, "tier-bench load: %llu errors in %llu operations\n",
                 static_cast<unsigned long long>(errors), static_cast<unsigned long long>(ops));
    return 1;
  }
  if (lat.empty()) {
    std::fprintf(stderr, "tier-bench load: no lease completed\n");
    return 1;
  }
  return 0;
}

}  // namespace tier::bench
