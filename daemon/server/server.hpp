// The daemon's event loop: one thread, epoll over the listening socket, the client sockets, a
// signalfd (SIGTERM/SIGINT: clean exit), a timerfd for lease-wait deadlines and a periodic
// timerfd for systemd STATUS= and watchdog pings.
//
// The listening socket is SOCK_SEQPACKET, mode 0666: any uid may connect, and each request is
// authorized by the peer's SO_PEERCRED uid in the request handler. Replies that would block
// (a client that stopped reading) queue per connection and are flushed on EPOLLOUT.
#pragma once

#include <signal.h>

#include <memory>
#include <string>

#include "rpc/request_handler.hpp"
#include "state/state.hpp"

namespace tier::daemon {

// The signals that stop tierd (SIGTERM, SIGINT, SIGHUP). run() reads them from a signalfd,
// which sees them only while every thread blocks them: main() blocks this set before any
// thread starts (threads inherit their creator's mask).
sigset_t stop_signals();

class Server {
 public:
  Server(DaemonState& state, std::string socket_path);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens (replacing a stale socket file, refusing a live one).
  [[nodiscard]] Status listen();
  // Serves until SIGTERM/SIGINT; returns ok on a clean stop.
  [[nodiscard]] Status run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tier::daemon
