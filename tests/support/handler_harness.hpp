// A RequestHandler over a real DaemonState in a temporary state directory, driven in-process:
// no sockets, no event loop. Sessions are made by hand; replies come back from handle(), and
// deferred replies (lease waits) land in `deferred` through the handler's sink. With an NVMe
// tier, I/O completes only when the test calls tier_poll() (or call_waiting() does), so the
// interleavings of requests and completions are the same on every run.
//
// Header-only (it uses Catch's REQUIRE); link the test with tierd_core.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/daemon.hpp"
#include "ram/arena.hpp"
#include "rpc/request_handler.hpp"
#include "base/errors.hpp"

namespace tier::test {

class HandlerHarness {
 public:
  // `cfg.state_dir` is replaced by a fresh temporary directory (removed with its arenas at
  // destruction); NVMe directories the config names are the caller's.
  HandlerHarness(daemon::Config cfg, daemon::ResolvedSizes sizes) {
    char tmpl[] = "/tmp/tierd-handler.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    cfg.state_dir = dir;
    auto st = daemon::make_state(std::move(cfg), sizes);
    REQUIRE(st);
    state = std::move(*st);
    handler = std::make_unique<daemon::RequestHandler>(*state);
    handler->set_deferred_sink([this](uint64_t sid, std::span<const std::byte> b) {
      deferred.emplace_back(sid, std::vector<std::byte>(b.begin(), b.end()));
    });
  }
  ~HandlerHarness() {
    handler.reset();
    std::string prefix = daemon::arena_prefix(dir);
    state.reset();
    daemon::remove_arenas(prefix);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  HandlerHarness(const HandlerHarness&) = delete;
  HandlerHarness& operator=(const HandlerHarness&) = delete;

  // A new session of `uid` (gid = uid); with `hello`, its Hello is sent and must succeed.
  std::unique_ptr<daemon::Session> session(uid_t uid = 0, bool hello = true) {
    auto s = std::make_unique<daemon::Session>();
    s->id = next_session++;
    s->uid = uid;
    s->gid = uid;
    handler->session_opened(*s);
    if (hello)
      REQUIRE(call<wire::HelloRep>(*s, wire::MsgType::kHello, wire::HelloReq{wire::kVersion, 1, -1, "test"}));
    return s;
  }

  daemon::Reply raw(daemon::Session& s, std::span<const std::byte> bytes) {
    daemon::Reply r;
    handler->handle(s, bytes, r);
    return r;
  }

  // One request (id 99). A deferred reply is kUnavailable "deferred" (see call_waiting()).
  template <class Rep, class Req>
  Result<Rep> call(daemon::Session& s, wire::MsgType t, const Req& req, daemon::Reply* keep = nullptr) {
    std::vector<std::byte> out;
    if (Status st = wire::encode(static_cast<uint16_t>(t), 99, req, out); !st) return fail(st);
    daemon::Reply r = raw(s, out);
    if (keep) *keep = r;
    if (r.deferred) return fail(Code::kUnavailable, "deferred");
    return decode<Rep>(r.bytes, t);
  }

  // One request; a deferred reply is waited for by polling the NVMe tier (10 s at most).
  template <class Rep, class Req>
  Result<Rep> call_waiting(daemon::Session& s, wire::MsgType t, const Req& req) {
    std::vector<std::byte> out;
    if (Status st = wire::encode(static_cast<uint16_t>(t), 99, req, out); !st) return fail(st);
    daemon::Reply r = raw(s, out);
    if (!r.deferred) return decode<Rep>(r.bytes, t);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (deferred.empty()) {
      if (std::chrono::steady_clock::now() > until) return fail(Code::kTimeout, "no deferred reply");
      handler->tier_poll();
      if (deferred.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    std::vector<std::byte> bytes = std::move(deferred.front().second);
    deferred.erase(deferred.begin());
    return decode<Rep>(bytes, t);
  }

  // The mapped bytes of a granted lease.
  std::byte* at(const wire::LeaseGrant& g) {
    daemon::Arena* a = state->ram->arena(g.arena_id);
    REQUIRE(a != nullptr);
    return a->base() + g.offset;
  }

  std::string dir;
  std::unique_ptr<daemon::DaemonState> state;
  std::unique_ptr<daemon::RequestHandler> handler;
  std::vector<std::pair<uint64_t, std::vector<std::byte>>> deferred;
  uint64_t next_session = 1;

 private:
  template <class Rep> Result<Rep> decode(std::span<const std::byte> bytes, wire::MsgType t) {
    auto h = wire::parse_header(bytes);
    if (!h) return fail(h.error());
    REQUIRE(h->type == (static_cast<uint16_t>(t) | wire::kReplyBit));
    REQUIRE(h->request_id == 99);
    return wire::decode_reply<Rep>(wire::payload_of(bytes));
  }
};

}  // namespace tier::test
