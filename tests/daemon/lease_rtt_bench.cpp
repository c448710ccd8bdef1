// Lease round trip against a raw Unix-socket ping-pong of the same message sizes, measured
// side by side in one run (the daemon's figure of merit). Prints JSON lines; not a test.
//   build*/bin/daemon_lease_rtt_bench [iterations]
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"

using namespace tier;
using namespace tier::test;
using Clock = std::chrono::steady_clock;

namespace {

double raw_pingpong_ns(int iters, size_t req_bytes, size_t rep_bytes) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) std::abort();
  std::thread echo([&] {
    std::vector<char> buf(65536), rep(rep_bytes, 'r');
    for (;;) {
      ssize_t n = recv(sv[1], buf.data(), buf.size(), 0);
      if (n <= 0) return;
      if (send(sv[1], rep.data(), rep.size(), MSG_NOSIGNAL) < 0) return;
    }
  });
  std::vector<char> req(req_bytes, 'q'), buf(65536);
  for (int i = 0; i < 1000; ++i) {
    (void)!send(sv[0], req.data(), req.size(), 0);
    (void)!recv(sv[0], buf.data(), buf.size(), 0);
  }
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    (void)!send(sv[0], req.data(), req.size(), 0);
    (void)!recv(sv[0], buf.data(), buf.size(), 0);
  }
  double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
  shutdown(sv[0], SHUT_RDWR);
  echo.join();
  close(sv[0]);
  close(sv[1]);
  return ns;
}

}  // namespace

// One lease + one release through the daemon with the client side kept to the bare syscalls
// (pre-sized buffers, no per-call allocation), so the ratio shows the daemon's own cost.
struct LeaseLoop {
  int fd = -1;
  std::vector<std::byte> out, in = std::vector<std::byte>(65536);
  wire::LeaseReq req{static_cast<uint8_t>(LeaseMode::kRead), 0, {0}};
  wire::ReleaseReq rel{{0}};
  uint32_t rid = 1;
  bool round_trip(uint64_t tensor_id, double& lease_ns, double& release_ns) {
    req.tensor_ids[0] = tensor_id;
    auto t0 = Clock::now();
    if (!wire::encode(static_cast<uint16_t>(wire::MsgType::kLease), rid++, req, out)) return false;
    if (send(fd, out.data(), out.size(), 0) < 0) return false;
    ssize_t n = recv(fd, in.data(), in.size(), 0);
    if (n <= 0) return false;
    auto t1 = Clock::now();
    uint64_t lease_id;  // the first grant's lease id sits after header, status and count
    std::memcpy(&lease_id, in.data() + wire::kHeaderBytes + 6 + 4, 8);
    rel.lease_ids[0] = lease_id;
    if (!wire::encode(static_cast<uint16_t>(wire::MsgType::kRelease), rid++, rel, out)) return false;
    if (send(fd, out.data(), out.size(), 0) < 0) return false;
    n = recv(fd, in.data(), in.size(), 0);
    if (n != static_cast<ssize_t>(wire::kHeaderBytes + 6)) return false;  // ok status, empty body
    auto t2 = Clock::now();
    lease_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
    release_ns += std::chrono::duration<double, std::nano>(t2 - t1).count();
    return true;
  }
};

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 50000;
  DaemonOptions o;
  o.extra_args = {"--remove-arenas-on-exit"};
  TestDaemon d(o);
  auto c = RawClient::connect(d.socket());
  if (!c || !c->pool_create("bench", 64 << 20)) return 1;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 1024; ++i) {
    auto t = c->tensor_create("bench", "t" + std::to_string(i), 4096);
    if (!t) return 1;
    ids.push_back(t->id);
  }
  // Interleaved chunks of lease/release and raw ping-pong, so that load on the machine hits
  // both alike; the figure is the median chunk ratio.
  LeaseLoop loop;
  loop.fd = c->fd();
  constexpr int kChunk = 2000;
  std::vector<double> lease_r, release_r, lease_v, raw_v;
  for (int done = 0; done < iters; done += kChunk) {
    double l = 0, r = 0;
    for (int i = 0; i < kChunk; ++i)
      if (!loop.round_trip(ids[static_cast<size_t>(done + i) % ids.size()], l, r)) return 1;
    l /= kChunk;
    r /= kChunk;
    double raw = raw_pingpong_ns(kChunk, 16 + 1 + 4 + 4 + 8, 16 + 6 + 4 + 40);
    lease_r.push_back(l / raw);
    release_r.push_back(r / raw);
    lease_v.push_back(l);
    raw_v.push_back(raw);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "{\"name\":\"daemon_lease_rtt\",\"value\":%.0f,\"unit\":\"ns\",\"baseline\":%.0f,\"ratio\":%.3f}\n",
      median(lease_v), median(raw_v), median(lease_r));
  std::printf(
      "{\"name\":\"daemon_release_rtt\",\"value\":%.0f,\"unit\":\"ns\",\"baseline\":%.0f,\"ratio\":%.3f}\n",
      median(lease_v) * median(release_r) / median(lease_r), median(raw_v), median(release_r));
  // Batched: 1024 tensors per lease request.
  int batches = std::max(1, iters / 100);
  auto t0 = Clock::now();
  for (int i = 0; i < batches; ++i) {
    auto l = c->lease(LeaseMode::kRead, ids);
    if (!l) return 1;
    std::vector<uint64_t> lids;
    lids.reserve(l->grants.size());
    for (auto& g : l->grants) lids.push_back(g.lease_id);
    if (!c->release(lids)) return 1;
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "{\"name\":\"daemon_batched_leases\",\"value\":%.0f,\"unit\":\"leases/"
      "s\",\"baseline\":200000,\"ratio\":%.3f}\n",
      batches * 1024.0 / secs, batches * 1024.0 / secs / 200000);
  return 0;
}
