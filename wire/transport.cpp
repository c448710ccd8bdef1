#include "wire/transport.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "wire/messages.hpp"
#include "base/errors.hpp"

namespace tier::wire {

Status send_datagram(int sock, std::span<const std::byte> bytes, int pass_fd) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != bytes.size())
        return Status(Code::kIo, "short send on a SOCK_SEQPACKET socket");
      return Status::ok();
    }
    if (errno == EINTR) continue;
    return Status::from_errno(errno, "send on the tierd socket");
  }
}

Result<size_t> recv_datagram_into(int sock, std::span<std::byte> buf, int* fd_out, int* errno_out) {
  if (fd_out) *fd_out = -1;
  if (errno_out) *errno_out = 0;
  if (buf.size() < kMaxMessageBytes + 1)
    return fail(Code::kInvalidArgument, "receive buffer smaller than a datagram");
  iovec iov{buf.data(), kMaxMessageBytes + 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  for (;;) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno_out) *errno_out = errno;
    return fail(Status::from_errno(errno, "receive on the tierd socket"));
  }
  int got_fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfds; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got_fd < 0 && fd_out) got_fd = fd;
      else ::close(fd);  // only one fd is ever expected; never leak extras
    }
  }
  auto failed = [&](Code code, const char* why) {
    if (got_fd >= 0) ::close(got_fd);
    return fail(code, why);
  };
  if (n == 0) return failed(Code::kUnavailable, "connection closed by peer");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || static_cast<size_t>(n) > kMaxMessageBytes)
    return failed(Code::kProtocol, "datagram larger than 64 KiB or truncated");
  if (fd_out) *fd_out = got_fd;
  return static_cast<size_t>(n);
}

Status recv_datagram(int sock, std::vector<std::byte>& buf, int* fd_out) {
  buf.resize(kMaxMessageBytes + 1);
  auto n = recv_datagram_into(sock, buf, fd_out);
  if (!n) {
    buf.clear();
    return n.error();
  }
  buf.resize(*n);
  return Status::ok();
}

}  // namespace tier::wire
