#include "support/raw_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "wire/transport.hpp"
#include "base/errors.hpp"

namespace tier::test {

RawClient::~RawClient() { close(); }

RawClient& RawClient::operator=(RawClient&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    next_id_ = o.next_id_;
    o.fd_ = -1;
  }
  return *this;
}

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<RawClient> RawClient::connect(const std::string& path, bool hello, int32_t numa_node) {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(Status::from_errno(errno, "socket"));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int e = errno;
    ::close(fd);
    return fail(Status::from_errno(e, "connect " + path));
  }
  RawClient c(fd);
  if (hello) {
    wire::HelloReq h;
    h.pid = static_cast<int32_t>(::getpid());
    h.numa_node = numa_node;
    h.client_name = "raw";
    auto r = c.call<wire::HelloRep>(wire::MsgType::kHello, h);
    if (!r) return fail(r.error());
  }
  return c;
}

Status RawClient::send_raw(std::span<const std::byte> bytes) { return wire::send_datagram(fd_, bytes); }

Result<std::vector<std::byte>> RawClient::recv_raw(int* fd_out, int timeout_ms) {
  if (timeout_ms >= 0) {
    pollfd p{fd_, POLLIN, 0};
    int n = ::poll(&p, 1, timeout_ms);
    if (n == 0) return fail(Code::kTimeout, "no reply within " + std::to_string(timeout_ms) + " ms");
  }
  std::vector<std::byte> buf;
  if (Status st = wire::recv_datagram(fd_, buf, fd_out); !st) return fail(st);
  return buf;
}

Result<wire::PoolInfoW> RawClient::pool_create(const std::string& name, uint64_t ram_quota) {
  wire::PoolCreateReq r;
  r.name = name;
  r.ram_quota = ram_quota;
  return call<wire::PoolInfoW>(wire::MsgType::kPoolCreate, r);
}

Result<wire::TensorInfoW> RawClient::tensor_create(const std::string& pool, const std::string& name,
                                                   uint64_t size, uint8_t placement_kind,
                                                   int32_t placement_index) {
  wire::TensorCreateReq r;
  r.pool = pool;
  r.name = name;
  r.size = size;
  r.placement_kind = placement_kind;
  r.placement_index = placement_index;
  return call<wire::TensorInfoW>(wire::MsgType::kTensorCreate, r);
}

Result<wire::LeaseRep> RawClient::lease(LeaseMode mode, std::vector<uint64_t> ids, int32_t timeout_ms) {
  wire::LeaseReq r;
  r.mode = static_cast<uint8_t>(mode);
  r.timeout_ms = timeout_ms;
  r.tensor_ids = std::move(ids);
  return call<wire::LeaseRep>(wire::MsgType::kLease, r);
}

Status RawClient::release(std::vector<uint64_t> lease_ids) {
  wire::ReleaseReq r;
  r.lease_ids = std::move(lease_ids);
  auto rep = call<wire::Empty>(wire::MsgType::kRelease, r);
  return rep ? Status::ok() : rep.error();
}

}  // namespace tier::test
