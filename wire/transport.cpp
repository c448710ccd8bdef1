#include "wire/transport.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "wire/messages.hpp"

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

Status recv_datagram(int sock, std::vector<std::byte>& buf, int* fd_out) {
  if (fd_out) *fd_out = -1;
  buf.resize(kMaxMessageBytes + 1);
  iovec iov{buf.data(), buf.size()};
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
    buf.clear();
    return Status::from_errno(errno, "receive on the tierd socket");
  }
  int got_fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfds; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (got_fd < 0 && fd_out) got_fd = fd;
        else ::close(fd);  // only one fd is ever expected; never leak extras
      }
    }
  }
  if (n == 0) {
    if (got_fd >= 0) ::close(got_fd);
    buf.clear();
    return Status(Code::kUnavailable, "connection closed by peer");
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || static_cast<size_t>(n) > kMaxMessageBytes) {
    if (got_fd >= 0) ::close(got_fd);
    buf.clear();
    return Status(Code::kProtocol, "datagram larger than 64 KiB or truncated");
  }
  buf.resize(static_cast<size_t>(n));
  if (fd_out) *fd_out = got_fd;
  return Status::ok();
}

}  // namespace tier::wire
