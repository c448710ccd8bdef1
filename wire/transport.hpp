// Sending and receiving whole datagrams on a SOCK_SEQPACKET Unix socket, with an optional
// file descriptor passed as SCM_RIGHTS. Shared by tierd and libtier.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "tier/status.hpp"

namespace tier::wire {

// Sends one datagram; `pass_fd` >= 0 is attached as SCM_RIGHTS. Retries EINTR. Blocking
// sockets block; on a non-blocking socket EAGAIN is returned as kBusy.
[[nodiscard]] Status send_datagram(int sock, std::span<const std::byte> bytes, int pass_fd = -1);

// Receives one datagram into `buf` (resized to what arrived, capacity kMaxMessageBytes + 1 so
// oversized datagrams are seen as truncated). A received fd is stored in *fd_out (or closed
// when fd_out is null); MSG_CTRUNC or MSG_TRUNC is kProtocol. A closed peer is kUnavailable.
[[nodiscard]] Status recv_datagram(int sock, std::vector<std::byte>& buf, int* fd_out = nullptr);

// The same into caller-owned memory (no allocation: the client's hot path). `buf` must hold at
// least kMaxMessageBytes + 1 bytes. Returns the datagram's length. When recvmsg itself fails,
// *errno_out (if given) gets its errno so the caller can tell a dead peer from other errors;
// it is 0 for the other failures. A received fd is closed on every failure.
[[nodiscard]] Result<size_t> recv_datagram_into(int sock, std::span<std::byte> buf, int* fd_out,
                                                int* errno_out = nullptr);

}  // namespace tier::wire
