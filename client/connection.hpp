// One control connection from libtier to tierd: a connected SOCK_SEQPACKET socket, the request
// id counter and reusable send/receive buffers.
//
// Thread-safety: none. The owner (Client::Impl) serializes every call under its own mutex, so
// a request and its reply are never interleaved with another thread's.
//
// fork(): a child gets no connection. Every open connection's socket is closed in the child
// (a pthread_atfork handler) and its calls fail with kUnsupported: a child must connect its own
// Client. Otherwise a child (a DataLoader worker) that outlives its parent would keep the
// parent's session, and with it the parent's leases, alive in tierd; and two processes sharing
// one socket would read each other's replies.
//
// Hot path: call() neither allocates nor zero-fills once the buffers have grown to their
// working size: the send buffer is reused (vector::clear keeps capacity), the receive buffer is
// allocated once at kMaxMessageBytes + 1 and filled by recvmsg directly, and reply bodies are
// decoded into caller-owned structs whose vectors keep their capacity between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tier/status.hpp"
#include "wire/messages.hpp"
#include "base/errors.hpp"

namespace tier::client {

class Connection {
 public:
  Connection();
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects to `path`, retrying while the socket is missing or refuses (the daemon is starting
  // or restarting) until `timeout_ms` has passed. kUnavailable when it never accepts.
  [[nodiscard]] Status open(const std::string& path, int64_t timeout_ms);
  void close() noexcept;
  bool is_open() const noexcept { return fd_ >= 0; }
  // The fork handler, in the child: the parent's socket is closed and never used again.
  void forget_parent() noexcept;
  // Whether the last call() got its request out before it failed (the daemon may have acted on
  // it) — what decides if a non-idempotent request may be retried after a reconnect.
  bool last_sent() const noexcept { return last_sent_; }

  // Sends `req` as message `type` and decodes the reply into `rep`. A reply of another id or
  // type is kProtocol and breaks the connection (nothing after it can be trusted). A received
  // fd (MapArena) is stored in *fd_out, else closed. Once broken, every call fails with the
  // status that broke it.
  template <class Req, class Rep>
  [[nodiscard]] Status call(wire::MsgType type, const Req& req, Rep& rep, int* fd_out = nullptr) {
    last_sent_ = false;
    TIER_TRY(broken_);
    TIER_TRY(send_request(type, req));
    last_sent_ = true;
    TIER_TRY(receive_reply(type, fd_out));
    return decode_body(rep);
  }

 private:
  template <class Req> Status send_request(wire::MsgType type, const Req& req) {
    Status st = wire::encode(static_cast<uint16_t>(type), ++last_id_, req, send_buf_);
    TIER_TRY(st);  // too large to send: the caller's fault, the link is intact
    return send_buf();
  }
  Status send_buf();
  // Receives the reply to the last request; on success payload_ holds the reply payload.
  Status receive_reply(wire::MsgType type, int* fd_out);
  // Status, then body, consumed exactly; mirrors wire::decode_reply but decodes in place.
  template <class Rep> Status decode_body(Rep& rep) {
    wire::Reader r(payload_);
    r(status_scratch_);
    if (!r.ok()) return mark_broken(Status(Code::kProtocol, "truncated reply status from tierd"));
    if (status_scratch_.code != 0) {
      if (status_scratch_.code > kMaxCode || !r.at_end())
        return mark_broken(Status(Code::kProtocol, "malformed error reply from tierd"));
      return Status(static_cast<Code>(status_scratch_.code), status_scratch_.message);
    }
    r(rep);
    if (!r.ok() || !r.at_end())
      return mark_broken(Status(Code::kProtocol, "malformed reply body from tierd"));
    return Status::ok();
  }
  Status mark_broken(Status st);
  Status link_error(int err, const char* what);

  int fd_ = -1;
  bool forked_ = false;  // this object was inherited through fork(): it never connects again
  std::string path_;
  uint32_t last_id_ = 0;
  bool last_sent_ = false;
  Status broken_;
  std::vector<std::byte> send_buf_;
  std::unique_ptr<std::byte[]> recv_buf_;
  std::span<const std::byte> payload_;
  wire::ReplyStatus status_scratch_;
};

}  // namespace tier::client
