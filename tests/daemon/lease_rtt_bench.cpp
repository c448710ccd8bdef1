// Lease round trip against a raw Unix-socket ping-pong of the same message sizes, measured
// side by side in one run (the daemon's figure of merit). Prints JSON lines; not a test.
//   build*/bin/daemon_lease_rtt_bench [iterations]
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
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
  for (int round = 0; round < 3; ++round) {
    // Lease one tensor, then release it: two round trips per iteration; timed separately.
    double lease_ns = 0, release_ns = 0;
    for (int i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      auto l = c->lease(LeaseMode::kRead, {ids[static_cast<size_t>(i) % ids.size()]});
      auto t1 = Clock::now();
      if (!l || !c->release({l->grants[0].lease_id})) return 1;
      auto t2 = Clock::now();
      lease_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
      release_ns += std::chrono::duration<double, std::nano>(t2 - t1).count();
    }
    lease_ns /= iters;
    release_ns /= iters;
    double raw = raw_pingpong_ns(iters, 16 + 1 + 4 + 4 + 8, 16 + 6 + 4 + 40);
    std::printf("{\"name\":\"daemon_lease_rtt\",\"value\":%.0f,\"unit\":\"ns\",\"baseline\":%.0f,\"ratio\":%.3f}\n",
                lease_ns, raw, lease_ns / raw);
    std::printf("{\"name\":\"daemon_release_rtt\",\"value\":%.0f,\"unit\":\"ns\",\"baseline\":%.0f,\"ratio\":%.3f}\n",
                release_ns, raw, release_ns / raw);
  }
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
  std::printf("{\"name\":\"daemon_batched_leases\",\"value\":%.0f,\"unit\":\"leases/s\",\"baseline\":200000,\"ratio\":%.3f}\n",
              batches * 1024.0 / secs, batches * 1024.0 / secs / 200000);
  return 0;
}
