#include "server/server.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <unordered_map>

#include "base/log.hpp"
#include "server/metrics_http.hpp"
#include "wire/transport.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

namespace {

// epoll tags below kFirstSession name the daemon's own fds; connections use their session id.
constexpr uint64_t kTagListen = 1, kTagSignal = 2, kTagLeaseTimer = 3, kTagTick = 4, kTagTier = 5;
constexpr uint64_t kTagDurable = 6;  // snapshot writers finished (Durability::event_fd)
constexpr uint64_t kFirstSession = 16;
// The tag of a connection's pidfd (its connecting process exited): the session id with this bit.
constexpr uint64_t kTagPidBit = uint64_t{1} << 63;

// A pidfd of `pid` (pidfd_open, Linux 5.3+), readable once that process has exited; -1 when
// there is none to watch: pid 0 (the peer is in a pid namespace tierd cannot see), a kernel
// without pidfd_open, or a process already gone (ESRCH: its hang-up comes from the socket).
int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  if (pid <= 0) return -1;
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) return static_cast<int>(fd);  // close-on-exec, as every pidfd
  static bool told = false;
  if (errno != ESRCH && !std::exchange(told, true))
    log_info("pidfd_open: {}; a client's exit is seen only when its socket closes", std::strerror(errno));
#else
  (void)pid;
#endif
  return -1;
}
constexpr size_t kMaxQueuedReplies = 4096;  // a client this far behind is dropped
// Queued reply bytes past which a closed or drained queue gives its memory back to the system
// (malloc_trim, once at the end of the loop iteration).
constexpr uint64_t kTrimAfterBytes = 1 << 20;
// Messages read from one client per readiness event. One: a request/response client almost
// never has a second message queued, so trying again costs a recvmsg that fails with EAGAIN;
// level-triggered epoll reports a pipelining client again on the next wait, which also keeps
// clients fair.
constexpr int kMaxPerWakeup = 1;

struct Pending {
  std::vector<std::byte> bytes;
  int fd = -1;  // owned dup of the fd to pass, or -1
};

struct Conn {
  int fd = -1;
  // The connecting process (SO_PEERCRED pid) as a pidfd, or -1. A forked child may keep the
  // socket open after that process died (kill -9 of a job whose DataLoader workers inherited
  // it): its exit is the hang-up then, or its leases would stay held.
  int pidfd = -1;
  Session session;
  std::deque<Pending> outq;
  uint64_t queued = 0;       // bytes of outq
  uint64_t queued_peak = 0;  // since the queue was last empty
  bool want_out = false;
  bool reading = true;  // EPOLLIN armed: off while its queue is over max_reply_bytes_per_connection
  bool dead = false;
};

sockaddr_un unix_addr(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  return a;
}

}  // namespace

struct Server::Impl {
  DaemonState& st;
  RequestHandler handler;
  std::string path;
  int listen_fd = -1, epfd = -1, sigfd = -1, lease_timer = -1, tick_timer = -1;
  int reserve_fd = -1;  // held open so that running out of fds can still refuse a client
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;  // by session id
  std::vector<uint64_t> to_close;
  uint64_t next_session = kFirstSession;
  std::optional<Clock::time_point> armed_deadline;
  uint64_t watchdog_usec = 0;
  std::vector<std::byte> rbuf;
  Reply reply;
  // Replies to requests that journaled a change: sent after this iteration's commit.
  struct Held {
    uint64_t sid;
    std::vector<std::byte> bytes;
  };
  std::vector<Held> held;
  std::unique_ptr<MetricsHttp> http;  // metrics_listen; published on every tick
  // Reply bytes queued per uid, over its connections (max_reply_bytes_per_uid).
  std::unordered_map<uid_t, uint64_t> uid_queued;
  bool trim_due = false;
  // Test knob TIERD_TEST_HANGUP_DELAY_MS: a client's hang-up is handled this long after it is
  // read, so tests can make "a request served before the hang-up" deterministic (docs/daemon.md).
  std::chrono::milliseconds hangup_delay{0};
  struct DelayedHangup {
    uint64_t sid;
    Clock::time_point due;
  };
  std::deque<DelayedHangup> delayed_hangups;

  Impl(DaemonState& s, std::string p) : st(s), handler(s), path(std::move(p)) {
    handler.set_deferred_sink([this](uint64_t sid, std::span<const std::byte> bytes) {
      auto it = conns.find(sid);
      if (it != conns.end()) send(*it->second, bytes, -1);
    });
    handler.set_peer_gone([this](uint64_t sid) { return peer_gone(sid); });
    rbuf.resize(wire::kMaxMessageBytes + 1);
    if (const char* e = std::getenv("TIERD_TEST_HANGUP_DELAY_MS"); e && *e)
      hangup_delay = std::chrono::milliseconds(std::strtoul(e, nullptr, 10));
  }

  ~Impl() {
    for (auto& [id, c] : conns) {
      for (auto& p : c->outq)
        if (p.fd >= 0) ::close(p.fd);
      ::close(c->fd);
      if (c->pidfd >= 0) ::close(c->pidfd);
    }
    for (int fd : {listen_fd, epfd, sigfd, lease_timer, tick_timer, reserve_fd})
      if (fd >= 0) ::close(fd);
  }

  Status add(int fd, uint64_t tag, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return Status::from_errno(errno, "epoll_ctl add");
    return Status::ok();
  }

  void rearm(Conn& c) {
    epoll_event ev{};
    ev.events = (c.reading ? EPOLLIN : 0u) | (c.want_out ? EPOLLOUT : 0u);
    ev.data.u64 = c.session.id;
    ::epoll_ctl(epfd, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void set_out(Conn& c, bool on) {
    if (c.want_out == on) return;
    c.want_out = on;
    rearm(c);
  }

  // Backpressure: a connection whose unread replies reach max_reply_bytes_per_connection is not
  // read from (its requests wait in its socket, then its sends block) until half drained.
  void set_reading(Conn& c, bool on) {
    if (c.reading == on) return;
    c.reading = on;
    rearm(c);
  }

  void account(Conn& c, int64_t delta) {
    c.queued = static_cast<uint64_t>(static_cast<int64_t>(c.queued) + delta);
    c.queued_peak = std::max(c.queued_peak, c.queued);
    uint64_t& u = uid_queued[c.session.uid];
    u = static_cast<uint64_t>(static_cast<int64_t>(u) + delta);
    if (u == 0) uid_queued.erase(c.session.uid);
  }

  // Freed reply buffers go back to the system (glibc keeps them in its arenas otherwise) at
  // the end of the iteration: one malloc_trim for every queue that drained or closed in it.
  void trim(uint64_t freed) {
    if (freed >= kTrimAfterBytes) trim_due = true;
  }
  void trim_now() {
    if (!std::exchange(trim_due, false)) return;
    ::malloc_trim(0);
  }

  void kill(Conn& c) {
    if (c.dead) return;
    c.dead = true;
    to_close.push_back(c.session.id);
  }

  // The client closed its end (read returned 0, or the socket reports a hang-up).
  void hang_up(Conn& c) {
    if (hangup_delay.count() <= 0 || c.dead) return kill(c);
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nullptr);
    if (c.pidfd >= 0) ::epoll_ctl(epfd, EPOLL_CTL_DEL, c.pidfd, nullptr);
    delayed_hangups.push_back({c.session.id, Clock::now() + hangup_delay});
  }

  // The delayed hang-ups that are due are handled; returns the epoll_wait timeout (ms) until
  // the next one, or -1.
  int handle_delayed_hangups() {
    const auto now = Clock::now();
    while (!delayed_hangups.empty() && delayed_hangups.front().due <= now) {
      if (auto it = conns.find(delayed_hangups.front().sid); it != conns.end()) kill(*it->second);
      delayed_hangups.pop_front();
    }
    if (!to_close.empty()) return 0;  // closed at the end of the next iteration: do not block
    if (delayed_hangups.empty()) return -1;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(delayed_hangups.front().due - now).count();
    return static_cast<int>(std::max<int64_t>(ms, 0));
  }

  // Whether the process that connected `c` has exited (its pidfd is readable).
  static bool process_exited(const Conn& c) {
    if (c.pidfd < 0) return false;
    pollfd p{c.pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
  }

  // The connecting process of session `sid` exited: a hang-up, even while a forked child
  // still holds the socket open.
  void process_gone(uint64_t sid) {
    auto it = conns.find(sid);
    if (it == conns.end() || it->second->dead) return;
    Conn& c = *it->second;
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, c.pidfd, nullptr);
    log_debug("session {}: client pid {} exited", sid, c.session.pid);
    hang_up(c);
  }

  // LeaseService::PeerGone: whether session `sid`'s client has hung up (both directions shut:
  // it closed the socket or died). When it left nothing unread, the session is closed at the
  // end of this iteration; otherwise the loop reads what is left first, then sees the close.
  bool peer_gone(uint64_t sid) {
    auto it = conns.find(sid);
    if (it == conns.end()) return false;
    Conn& c = *it->second;
    if (c.dead) return true;
    if (process_exited(c)) {
      kill(c);
      return true;
    }
    pollfd p{c.fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1 || !(p.revents & (POLLHUP | POLLERR))) return false;
    char b;
    ssize_t n = ::recv(c.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) kill(c);
    return true;
  }

  // Sends now, or queues when the socket is full. `pass_fd` is borrowed.
  void send(Conn& c, std::span<const std::byte> bytes, int pass_fd) {
    if (c.dead) return;
    if (c.outq.empty()) {
      Status s = wire::send_datagram(c.fd, bytes, pass_fd);
      if (s) return;
      if (s.code() != Code::kBusy) {
        log_debug("session {}: {}", c.session.id, s.message());
        kill(c);
        return;
      }
    }
    const auto it = uid_queued.find(c.session.uid);
    const uint64_t uid_bytes = it == uid_queued.end() ? 0 : it->second;
    if (c.outq.size() >= kMaxQueuedReplies || uid_bytes + bytes.size() > st.config.max_reply_bytes_per_uid) {
      log_warn(
          "client pid {} (uid {}) stopped reading its replies ({} queued, {} for its uid); disconnecting it",
          c.session.pid, c.session.uid, format_size(c.queued), format_size(uid_bytes));
      kill(c);
      return;
    }
    Pending p;
    p.bytes.assign(bytes.begin(), bytes.end());
    p.fd = pass_fd >= 0 ? ::fcntl(pass_fd, F_DUPFD_CLOEXEC, 0) : -1;
    c.outq.push_back(std::move(p));
    account(c, static_cast<int64_t>(bytes.size()));
    set_out(c, true);
    if (c.queued >= st.config.max_reply_bytes_per_connection) set_reading(c, false);
  }

  // Takes the connection's queue off its uid's count and frees it.
  void drop_queue(Conn& c) {
    for (auto& p : c.outq)
      if (p.fd >= 0) ::close(p.fd);
    c.outq.clear();
    account(c, -static_cast<int64_t>(c.queued));
    trim(std::exchange(c.queued_peak, 0));
  }

  void flush(Conn& c) {
    while (!c.outq.empty() && !c.dead) {
      Pending& p = c.outq.front();
      Status s = wire::send_datagram(c.fd, p.bytes, p.fd);
      if (!s) {
        if (s.code() != Code::kBusy) kill(c);
        return;
      }
      if (p.fd >= 0) ::close(p.fd);
      account(c, -static_cast<int64_t>(p.bytes.size()));
      c.outq.pop_front();
    }
    if (c.queued <= st.config.max_reply_bytes_per_connection / 2) set_reading(c, true);
    if (c.outq.empty()) {
      set_out(c, false);
      c.outq.shrink_to_fit();
      trim(std::exchange(c.queued_peak, 0));
    }
  }

  void accept_all() {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if ((errno == EMFILE || errno == ENFILE) && reserve_fd >= 0) {
          // Out of fds: the pending connection would keep the level-triggered listen socket
          // readable forever. Spend the reserve fd to accept and close it, then re-arm.
          // (accept reports EMFILE before looking at the queue, so an empty queue shows here.)
          ::close(reserve_fd);
          int victim = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
          int err = errno;
          if (victim >= 0) ::close(victim);
          reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          if (victim < 0) {
            if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR)
              log_warn("accept: {}", std::strerror(err));
            return;
          }
          log_warn("refused a client: out of file descriptors ({} clients)", st.clients);
          continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) log_warn("accept: {}", std::strerror(errno));
        return;
      }
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        ::close(fd);
        continue;
      }
      if (st.clients >= st.config.max_clients) {
        log_warn("refusing client pid {}: {} clients connected (max_clients)", cred.pid, st.clients);
        ::close(fd);
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->session.id = next_session++;
      c->session.uid = cred.uid;
      c->session.gid = cred.gid;
      c->session.pid = cred.pid;
      {
        // Supplementary groups as of connect (Linux 4.13+); admin_group and pool groups use them.
        gid_t groups[256];
        socklen_t glen = sizeof groups;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
          c->session.groups.assign(groups, groups + glen / sizeof(gid_t));
      }
      if (Status s = add(fd, c->session.id, EPOLLIN); !s) {
        ::close(fd);
        continue;
      }
      c->pidfd = open_pidfd(cred.pid);
      if (c->pidfd >= 0 && !add(c->pidfd, c->session.id | kTagPidBit, EPOLLIN)) {
        ::close(c->pidfd);
        c->pidfd = -1;
      }
      handler.session_opened(c->session);
      st.clients++;
      log_debug("client pid {} uid {} connected (session {})", cred.pid, cred.uid, c->session.id);
      conns.emplace(c->session.id, std::move(c));
    }
  }

  void read_conn(Conn& c) {
    for (int i = 0; i < kMaxPerWakeup && !c.dead; ++i) {
      iovec iov{rbuf.data(), rbuf.size()};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      ssize_t n = ::recvmsg(c.fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) kill(c);
        return;
      }
      // Clients never pass fds; close any so a hostile peer cannot exhaust ours.
      for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t k = 0; k < nfds; ++k) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(cm) + k * sizeof(int), sizeof fd);
          ::close(fd);
        }
      }
      if (n == 0) {
        hang_up(c);
        return;
      }
      std::span<const std::byte> dgram(rbuf.data(), static_cast<size_t>(n));
      if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > wire::kMaxMessageBytes) {
        dgram = dgram.first(wire::kHeaderBytes < dgram.size() ? wire::kHeaderBytes : dgram.size());
        // parse_header rejects it (the length no longer matches), so the reply is kProtocol
        // and the connection closes.
      }
      uint64_t ack_before = st.durable ? st.durable->ack_seq() : 0;
      handler.handle(c.session, dgram, reply);
      if (!reply.deferred && !reply.bytes.empty()) {
        if (st.durable && st.durable->ack_seq() != ack_before) held.push_back({c.session.id, reply.bytes});
        else send(c, reply.bytes, reply.fd);
      }
      if (reply.close) {
        flush(c);
        kill(c);
      }
    }
  }

  void close_dead() {
    while (!to_close.empty()) {
      uint64_t sid = to_close.back();
      to_close.pop_back();
      auto it = conns.find(sid);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      ::epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nullptr);
      handler.session_closed(c.session);  // may answer waiters of other sessions
      drop_queue(c);
      ::close(c.fd);
      if (c.pidfd >= 0) ::close(c.pidfd);  // closing drops it from the epoll set
      st.clients--;
      log_debug("session {} closed", sid);
      conns.erase(it);
    }
  }

  void arm_lease_timer() {
    auto d = handler.next_deadline();
    if (d == armed_deadline) return;
    armed_deadline = d;
    itimerspec its{};
    if (d) {
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d->time_since_epoch()).count();
      if (ns <= 0) ns = 1;
      its.it_value.tv_sec = ns / 1000000000;
      its.it_value.tv_nsec = ns % 1000000000;
    }
    ::timerfd_settime(lease_timer, TFD_TIMER_ABSTIME, &its, nullptr);
  }

  // Group commit: one fdatasync for every change of this iteration, then the replies that
  // waited for it. An error means the journal cannot say what is on disk: acknowledge nothing.
  Status commit_and_flush() {
    if (!st.durable) return Status::ok();
    if (Status s = st.durable->commit(); !s) {
      held.clear();
      return Status(s.code(), "journal: " + s.message() + "; stopping without acknowledging more changes");
    }
    for (auto& h : held)
      if (auto it = conns.find(h.sid); it != conns.end()) send(*it->second, h.bytes, -1);
    held.clear();
    return Status::ok();
  }

  void tick() {
    std::string line = "STATUS=" + handler.status_line();
    if (watchdog_usec > 0) line += "\nWATCHDOG=1";
    sd_notify(0, line.c_str());
    if (http) http->publish(handler.http_metrics_text());
  }
};

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

Server::Server(DaemonState& state, std::string socket_path)
    : impl_(std::make_unique<Impl>(state, std::move(socket_path))) {}

Server::~Server() = default;

Status Server::listen() {
  Impl& m = *impl_;
  TIER_TRY(check_socket_path(m.path));
  std::error_code ec;
  auto parent = std::filesystem::path(m.path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  sockaddr_un addr = unix_addr(m.path);
  struct stat sb;
  if (::lstat(m.path.c_str(), &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode))
      return Status(Code::kInvalidArgument, "'" + m.path + "' exists and is not a socket");
    int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(probe);
    if (live) return Status(Code::kAlreadyExists, "another tierd is serving " + m.path);
    ::unlink(m.path.c_str());
  }
  m.listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (m.listen_fd < 0) return Status::from_errno(errno, "socket");
  if (::bind(m.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return Status::from_errno(errno, "bind " + m.path);
  // Any uid may connect; requests are authorized per pool by SO_PEERCRED.
  if (::chmod(m.path.c_str(), 0666) != 0) return Status::from_errno(errno, "chmod " + m.path);
  if (::listen(m.listen_fd, 512) != 0) return Status::from_errno(errno, "listen " + m.path);

  // Each client is two fds (its socket, its process's pidfd): allow as many as the hard limit permits.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  m.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  m.epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (m.epfd < 0) return Status::from_errno(errno, "epoll_create1");
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // already blocked by main(); also for embedders
  ::signal(SIGPIPE, SIG_IGN);
  m.sigfd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (m.sigfd < 0) return Status::from_errno(errno, "signalfd");
  m.lease_timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  m.tick_timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (m.lease_timer < 0 || m.tick_timer < 0) return Status::from_errno(errno, "timerfd_create");
  TIER_TRY(m.add(m.listen_fd, kTagListen, EPOLLIN));
  TIER_TRY(m.add(m.sigfd, kTagSignal, EPOLLIN));
  TIER_TRY(m.add(m.lease_timer, kTagLeaseTimer, EPOLLIN));
  TIER_TRY(m.add(m.tick_timer, kTagTick, EPOLLIN));
  if (m.st.durable) TIER_TRY(m.add(m.st.durable->event_fd(), kTagDurable, EPOLLIN));
  if (m.st.tiering) TIER_TRY(m.add(m.st.tiering->event_fd(), kTagTier, EPOLLIN));

  uint64_t usec = 0;
  if (m.st.config.watchdog && sd_watchdog_enabled(0, &usec) > 0) m.watchdog_usec = usec;
  uint64_t period_us = static_cast<uint64_t>(m.st.config.status_interval_ms) * 1000;
  if (m.watchdog_usec > 0) period_us = std::min(period_us, m.watchdog_usec / 2);
  if (!m.st.config.metrics_listen.empty()) {
    auto addr = parse_metrics_listen(m.st.config.metrics_listen);
    TIER_TRY(addr);
    m.http = std::make_unique<MetricsHttp>();
    TIER_TRY(m.http->start(*addr));
    m.http->publish(m.handler.http_metrics_text());
    log_info("serving Prometheus metrics on http://{}:{}/metrics", addr->host, m.http->port());
    period_us = std::min<uint64_t>(period_us, 1000000);  // scrapes see figures at most 1 s old
  }
  if (period_us == 0) period_us = 1000;
  itimerspec its{};
  its.it_interval.tv_sec = static_cast<time_t>(period_us / 1000000);
  its.it_interval.tv_nsec = static_cast<long>(period_us % 1000000) * 1000;
  its.it_value = its.it_interval;
  ::timerfd_settime(m.tick_timer, 0, &its, nullptr);
  return Status::ok();
}

Status Server::run() {
  Impl& m = *impl_;
  log_info("listening on {} (RAM tier {}, {} NUMA nodes, topology {})", m.path,
           format_size(m.st.ram->capacity()), m.st.topology.nodes.size(), m.st.topology.source);
  sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%d", m.handler.status_line().c_str(),
             static_cast<int>(::getpid()));
  epoll_event events[64];
  bool stop = false;
  while (!stop) {
    m.arm_lease_timer();
    int n = ::epoll_wait(m.epfd, events, 64, m.handle_delayed_hangups());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kTagListen) {
        m.accept_all();
      } else if (tag == kTagSignal) {
        signalfd_siginfo si;
        while (::read(m.sigfd, &si, sizeof si) == sizeof si) {
          if (si.ssi_signo == SIGHUP) {
            log_info("SIGHUP ignored: restart tierd to change its configuration");
            continue;
          }
          log_info("signal {} received; stopping", si.ssi_signo);
          stop = true;
        }
      } else if (tag == kTagLeaseTimer) {
        uint64_t x;
        while (::read(m.lease_timer, &x, sizeof x) == sizeof x) {}
        m.armed_deadline.reset();
        m.handler.expire(Clock::now());
      } else if (tag == kTagTier) {
        // NVMe completions and prefetch timers: handled by tier_poll() after this batch.
      } else if (tag == kTagDurable) {
        TIER_TRY(m.handler.snapshot_poll());
      } else if (tag == kTagTick) {
        uint64_t x;
        while (::read(m.tick_timer, &x, sizeof x) == sizeof x) {}
        m.tick();
      } else if (tag & kTagPidBit) {
        m.process_gone(tag & ~kTagPidBit);
      } else {
        auto it = m.conns.find(tag);
        if (it == m.conns.end()) continue;
        Conn& c = *it->second;
        if (events[i].events & EPOLLOUT) m.flush(c);
        if (events[i].events & EPOLLIN) m.read_conn(c);
        if (events[i].events & (EPOLLERR | EPOLLHUP)) {
          if (!(events[i].events & EPOLLIN)) m.hang_up(c);
          else m.read_conn(c);  // drain what is left; read sees the close
        }
      }
    }
    m.handler.tier_poll();  // also catches completions reaped while a request waited for I/O
    TIER_TRY(m.commit_and_flush());
    m.close_dead();
    m.trim_now();
  }
  sd_notify(0, "STOPPING=1\nSTATUS=stopping");
  if (m.http) m.http->stop();
  ::close(m.listen_fd);
  m.listen_fd = -1;
  ::unlink(m.path.c_str());
  for (auto& [sid, c] : m.conns) m.to_close.push_back(sid);
  m.handler.stopping();
  m.close_dead();
  if (m.st.config.remove_arenas_on_exit) {
    m.st.ram->unlink_all();
    log_info("arenas removed (remove_arenas_on_exit)");
  } else {
    log_info("arenas kept in /dev/shm for the next start ({} arenas)", m.st.ram->arena_count());
  }
  log_info("stopped cleanly");
  return Status::ok();
}

}  // namespace tier::daemon
