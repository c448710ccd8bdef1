// fuzz_request: arbitrary sequences of control datagrams from two sessions (two peers, maybe
// different uids) through the daemon's RequestHandler,
// with a real (small) RAM tier in shared memory and a synthetic two-node topology, no sockets.
// Input format: fuzz/request_input.hpp (a peer uid, then length-prefixed datagrams).
//
// Properties checked beyond "no crash, no sanitizer report":
//   - every datagram gets exactly one reply unless the handler defers it (a lease wait) or
//     closes the connection over an untrustworthy header, and every reply is a well-formed
//     reply datagram: a valid header with the request's type
//     | kReplyBit and a payload that starts with a ReplyStatus of a known code;
//   - after each input, closing the session releases its leases, and dropping every pool
//     (as root) leaves the catalog and the RAM tier empty again, so inputs do not leak.
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/log.hpp"
#include "rpc/request_handler.hpp"
#include "daemon/daemon.hpp"
#include "fuzz/fuzz_check.hpp"
#include "fuzz/request_input.hpp"
#include "wire/messages.hpp"

using namespace tier;
using namespace tier::daemon;

namespace {

struct World {
  std::unique_ptr<DaemonState> state;
  std::unique_ptr<RequestHandler> handler;
  uint64_t next_session = 1;
};

World* g_world = nullptr;

void cleanup() {
  if (g_world && g_world->state && g_world->state->ram) g_world->state->ram->unlink_all();
}

World& world() {
  if (g_world) return *g_world;
  set_log_level(LogLevel::kError);  // a line per pool drop would drown the fuzzer's output
  Config cfg;
  // A per-process state dir name keeps the arenas of concurrent fuzzers apart; nothing is
  // written there (the handler does no file I/O), only the arena names derive from it.
  cfg.state_dir = "/tmp/tier-fuzz-request-" + std::to_string(::getpid());
  cfg.ram = "256M";
  cfg.topology = "synthetic:node:2 core:1 pu:1";
  cfg.remove_arenas_on_exit = true;
  auto sizes = resolve_sizes(cfg, 1ull << 30);
  if (!sizes) {
    std::fprintf(stderr, "fuzz_request: %s\n", sizes.error().to_string().c_str());
    std::abort();
  }
  auto st = make_state(cfg, *sizes);
  if (!st) {
    std::fprintf(stderr, "fuzz_request: %s\n", st.error().to_string().c_str());
    std::abort();
  }
  g_world = new World;
  g_world->state = std::move(*st);
  g_world->handler = std::make_unique<RequestHandler>(*g_world->state);
  g_world->handler->set_deferred_sink(
      [](uint64_t, std::span<const std::byte> reply) { FUZZ_CHECK(wire::parse_header(reply).has_value()); });
  std::atexit(cleanup);
  return *g_world;
}

void check_reply(std::span<const std::byte> request, const Reply& r) {
  if (r.deferred) {
    FUZZ_CHECK(r.bytes.empty());
    return;
  }
  // A datagram whose header cannot be trusted may be answered by just closing.
  if (r.bytes.empty()) {
    FUZZ_CHECK(r.close);
    FUZZ_CHECK(!wire::parse_header(request).has_value());
    return;
  }
  auto h = wire::parse_header(r.bytes);
  FUZZ_CHECK(h.has_value());
  FUZZ_CHECK((h->type & wire::kReplyBit) != 0);
  auto rq = wire::parse_header(request);
  if (rq) {
    FUZZ_CHECK(h->request_id == rq->request_id);
    FUZZ_CHECK(static_cast<uint16_t>(h->type & ~wire::kReplyBit) ==
               static_cast<uint16_t>(rq->type & ~wire::kReplyBit));
  }
  wire::Reader rd(wire::payload_of(r.bytes));
  wire::ReplyStatus rs;
  rd(rs);
  FUZZ_CHECK(rd.ok());
  FUZZ_CHECK(rs.code <= kMaxCode);
}

// Drops every pool as root through the handler itself.
void reset(World& w) {
  Session admin;
  admin.id = w.next_session++;
  admin.uid = 0;
  admin.gid = 0;
  admin.pid = 1;
  w.handler->session_opened(admin);
  Reply r;
  std::vector<std::byte> buf;
  if (wire::encode(static_cast<uint16_t>(wire::MsgType::kHello), 1, wire::HelloReq{}, buf).is_ok())
    w.handler->handle(admin, buf, r);
  r.reset();
  if (wire::encode(static_cast<uint16_t>(wire::MsgType::kPoolList), 2, wire::Empty{}, buf).is_ok())
    w.handler->handle(admin, buf, r);
  auto list = wire::decode_reply<wire::PoolListRep>(wire::payload_of(r.bytes));
  FUZZ_CHECK(list.has_value());
  for (const auto& p : list->pools) {
    r.reset();
    if (wire::encode(static_cast<uint16_t>(wire::MsgType::kPoolDrop), 3, wire::PoolNameReq{p.name}, buf)
            .is_ok())
      w.handler->handle(admin, buf, r);
    auto dropped = wire::decode_reply<wire::Empty>(wire::payload_of(r.bytes));
    if (!dropped) {
      std::fprintf(stderr, "fuzz_request: root could not drop pool '%s': %s\n", p.name.c_str(),
                   dropped.error().to_string().c_str());
      __builtin_trap();
    }
  }
  w.handler->session_closed(admin);
  FUZZ_CHECK(w.state->ram->used() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  World& w = world();
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  const uint8_t sel = std::to_integer<uint8_t>(in[0]);
  Session sessions[2];
  bool open[2] = {true, true};
  for (int i = 0; i < 2; ++i) {
    Session& s = sessions[i];
    s.id = w.next_session++;
    s.uid = fuzzreq::uid_for(i == 0 ? sel : sel >> 2);
    s.gid = s.uid;
    s.pid = 4242 + i;
    w.handler->session_opened(s);
  }
  Reply r;
  fuzzreq::for_each_datagram(in, [&](int which, std::span<const std::byte> d) {
    if (!open[which]) return true;
    r.reset();
    w.handler->handle(sessions[which], d, r);
    check_reply(d, r);
    if (r.close) {
      w.handler->session_closed(sessions[which]);
      open[which] = false;
    }
    return open[0] || open[1];
  });
  // Lease waiters left over time out, then the sessions go away.
  w.handler->expire(Clock::now() + std::chrono::hours(24 * 365));
  for (int i = 0; i < 2; ++i)
    if (open[i]) w.handler->session_closed(sessions[i]);
  reset(w);
  return 0;
}
