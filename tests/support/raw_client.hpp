// A minimal blocking client of the tierd wire protocol for tests, built on tier_wire only
// (independent of libtier, so daemon tests do not depend on the client library).
// One instance per thread; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tier/status.hpp"
#include "wire/messages.hpp"
#include "base/errors.hpp"

namespace tier::test {

class RawClient {
 public:
  RawClient() = default;
  ~RawClient();
  RawClient(RawClient&& o) noexcept : fd_(o.fd_), next_id_(o.next_id_) { o.fd_ = -1; }
  RawClient& operator=(RawClient&& o) noexcept;
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // Connects; with `hello` also sends Hello (client name "raw", given NUMA node).
  [[nodiscard]] static Result<RawClient> connect(const std::string& path, bool hello = true,
                                                 int32_t numa_node = -1);
  int fd() const noexcept { return fd_; }
  void close();

  // Sends a request and waits for its reply, decoded as Rep. A received fd goes to *fd_out
  // (or is closed).
  template <class Rep, class Req>
  [[nodiscard]] Result<Rep> call(wire::MsgType type, const Req& req, int* fd_out = nullptr) {
    uint32_t id = next_id_++;
    std::vector<std::byte> out;
    if (Status st = wire::encode(static_cast<uint16_t>(type), id, req, out); !st) return fail(st);
    if (Status st = send_raw(out); !st) return fail(st);
    return wait_reply<Rep>(type, id, fd_out);
  }
  // Sends a request without waiting; returns its request id.
  template <class Req> [[nodiscard]] Result<uint32_t> send(wire::MsgType type, const Req& req) {
    uint32_t id = next_id_++;
    std::vector<std::byte> out;
    if (Status st = wire::encode(static_cast<uint16_t>(type), id, req, out); !st) return fail(st);
    if (Status st = send_raw(out); !st) return fail(st);
    return id;
  }
  // Receives the next reply, which must be for (type, id).
  template <class Rep>
  [[nodiscard]] Result<Rep> wait_reply(wire::MsgType type, uint32_t id, int* fd_out = nullptr) {
    auto bytes = recv_raw(fd_out);
    if (!bytes) return fail(bytes.error());
    auto h = wire::parse_header(*bytes);
    if (!h) return fail(h.error());
    if (h->type != (static_cast<uint16_t>(type) | wire::kReplyBit) || h->request_id != id)
      return fail(Code::kProtocol, "reply does not match the request");
    return wire::decode_reply<Rep>(wire::payload_of(*bytes));
  }

  [[nodiscard]] Status send_raw(std::span<const std::byte> bytes);
  // Blocks for one datagram; `timeout_ms` >= 0 gives up with kTimeout.
  [[nodiscard]] Result<std::vector<std::byte>> recv_raw(int* fd_out = nullptr, int timeout_ms = -1);

  // Conveniences for the common calls.
  [[nodiscard]] Result<wire::PoolInfoW> pool_create(const std::string& name, uint64_t ram_quota = 0);
  [[nodiscard]] Result<wire::TensorInfoW> tensor_create(const std::string& pool, const std::string& name,
                                                        uint64_t size, uint8_t placement_kind = 0,
                                                        int32_t placement_index = -1);
  [[nodiscard]] Result<wire::LeaseRep> lease(LeaseMode mode, std::vector<uint64_t> ids,
                                             int32_t timeout_ms = 0);
  [[nodiscard]] Status release(std::vector<uint64_t> lease_ids);

 private:
  explicit RawClient(int fd) : fd_(fd) {}
  int fd_ = -1;
  uint32_t next_id_ = 1;
};

}  // namespace tier::test
