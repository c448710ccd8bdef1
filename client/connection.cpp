#include "client/connection.hpp"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "wire/transport.hpp"

namespace tier::client {

namespace {

bool is_link_gone(int err) {
  return err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ECONNABORTED;
}

// Every Connection of this process, for the fork handlers. Leaked on purpose: a Connection
// destroyed during static destruction must still find it.
std::mutex& registry_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_set<Connection*>& registry() {
  static auto* set = new std::unordered_set<Connection*>;
  return *set;
}

void lock_registry() noexcept { registry_mutex().lock(); }
void unlock_registry() noexcept { registry_mutex().unlock(); }

Status forked_error() {
  return Status(Code::kUnsupported,
                "this tier::Client was created before fork(): a forked child must connect its own");
}

// The child's side of fork(): runs in the child's only thread with the registry locked by the
// prepare handler, so no Connection is being opened or destroyed.
void forget_in_child() noexcept {
  for (Connection* c : registry()) c->forget_parent();
  unlock_registry();
}

}  // namespace

void Connection::forget_parent() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  forked_ = true;
}

Connection::Connection() {
  static std::once_flag once;
  std::call_once(once, [] { ::pthread_atfork(lock_registry, unlock_registry, forget_in_child); });
  std::lock_guard lock(registry_mutex());
  registry().insert(this);
}

Connection::~Connection() {
  close();
  std::lock_guard lock(registry_mutex());
  registry().erase(this);
}

void Connection::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status Connection::open(const std::string& path, int64_t timeout_ms) {
  if (forked_) return forked_error();
  close();
  path_ = path;
  broken_ = Status::ok();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return Status(Code::kInvalidArgument, "socket path '" + path + "' is empty or longer than " +
                                              std::to_string(sizeof addr.sun_path - 1) + " bytes");
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (!recv_buf_) recv_buf_ = std::make_unique<std::byte[]>(wire::kMaxMessageBytes + 1);
  send_buf_.reserve(4096);

  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::from_errno(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      fd_ = fd;
      return Status::ok();
    }
    int err = errno;
    ::close(fd);
    bool retryable = err == ENOENT || err == ECONNREFUSED || err == EAGAIN || err == EINTR;
    if (!retryable || std::chrono::steady_clock::now() >= deadline) {
      Status st = Status::from_errno(err, "cannot connect to tierd at " + path);
      // A missing or refusing socket means no daemon: say so in the code callers test.
      if (err == ENOENT || err == ECONNREFUSED || err == EAGAIN)
        return Status(Code::kUnavailable, st.message() + " (is tierd running?)");
      return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status Connection::mark_broken(Status st) {
  broken_ = st;
  close();
  return st;
}

Status Connection::link_error(int err, const char* what) {
  if (is_link_gone(err))
    return mark_broken(Status(Code::kUnavailable, std::string("tierd at ") + path_ +
                                                      " closed the connection during " + what +
                                                      " (daemon stopped or restarted)"));
  return mark_broken(Status::from_errno(err, std::string(what) + " on the tierd socket"));
}

Status Connection::send_buf() {
  if (forked_) return forked_error();
  if (fd_ < 0) return Status(Code::kUnavailable, "not connected to tierd");
  for (;;) {
    ssize_t n = ::send(fd_, send_buf_.data(), send_buf_.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != send_buf_.size())
        return mark_broken(Status(Code::kIo, "short send on the tierd socket"));
      return Status::ok();
    }
    if (errno == EINTR) continue;
    return link_error(errno, "send");
  }
}

Status Connection::receive_reply(wire::MsgType type, int* fd_out) {
  if (fd_out) *fd_out = -1;
  int got_fd = -1, err = 0;
  auto n = wire::recv_datagram_into(fd_, {recv_buf_.get(), wire::kMaxMessageBytes + 1},
                                    fd_out ? &got_fd : nullptr, &err);
  if (!n) {
    if (err != 0) return link_error(err, "receive");
    if (n.error().code() == Code::kUnavailable)
      return mark_broken(Status(Code::kUnavailable, "tierd at " + path_ +
                                                        " closed the connection (daemon stopped, "
                                                        "restarted, or refused this client)"));
    return mark_broken(Status(Code::kProtocol, "reply from tierd larger than 64 KiB or truncated"));
  }
  auto fail_with = [&](Status st) {
    if (got_fd >= 0) ::close(got_fd);
    return mark_broken(std::move(st));
  };
  std::span<const std::byte> dgram(recv_buf_.get(), *n);
  auto hdr = wire::parse_header(dgram);
  if (!hdr) return fail_with(Status(Code::kProtocol, "bad reply from tierd: " + hdr.error().message()));
  if (hdr->type != (static_cast<uint16_t>(type) | wire::kReplyBit) || hdr->request_id != last_id_)
    return fail_with(Status(Code::kProtocol,
                            "tierd answered request " + std::to_string(hdr->request_id) + " (type " +
                                std::to_string(hdr->type) + ") while request " + std::to_string(last_id_) +
                                " (type " + std::to_string(static_cast<uint16_t>(type)) + ") was pending"));
  payload_ = wire::payload_of(dgram);
  if (fd_out) *fd_out = got_fd;
  return Status::ok();
}

}  // namespace tier::client
