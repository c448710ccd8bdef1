#include "server/metrics_http.hpp"
#include "base/errors.hpp"

#include <httplib.h>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

namespace tier::daemon {

namespace {

// httplib reports a failed bind as `false` and loses errno; redo socket()+bind() here to say
// why. EAFNOSUPPORT is what systemd's RestrictAddressFamilies= turns socket() into.
Status bind_failure(const ListenAddr& a) {
  std::string where = a.host + ":" + std::to_string(a.port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int g = ::getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &res); g != 0)
    return Status(Code::kInvalidArgument,
                  "metrics_listen: cannot resolve " + a.host + ": " + ::gai_strerror(g));
  int err = 0;
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) err = errno;
  else {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0) err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (err == EAFNOSUPPORT)
    return Status::from_errno(err, "metrics_listen: cannot bind " + where +
                                       ": socket() refused the address family (under systemd, "
                                       "RestrictAddressFamilies= must allow AF_INET and AF_INET6)");
  if (err != 0) return Status::from_errno(err, "metrics_listen: cannot bind " + where);
  return Status(Code::kInvalidArgument, "metrics_listen: cannot bind " + where);
}

}  // namespace

MetricsHttp::MetricsHttp() : srv_(std::make_unique<httplib::Server>()) {
  text_.store(std::make_shared<const std::string>(), std::memory_order_release);
}

MetricsHttp::~MetricsHttp() { stop(); }

Status MetricsHttp::start(const ListenAddr& a) {
  srv_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::shared_ptr<const std::string> t = text_.load(std::memory_order_acquire);
    res.set_content(*t, "text/plain; version=0.0.4; charset=utf-8");
  });
  srv_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("tierd metrics: GET /metrics\n", "text/plain");
  });
  srv_->set_keep_alive_max_count(16);
  srv_->new_task_queue = [] { return new httplib::ThreadPool(1); };
  if (a.port == 0) {
    port_ = srv_->bind_to_any_port(a.host);
    if (port_ < 0) return bind_failure(a);
  } else {
    if (!srv_->bind_to_port(a.host, a.port)) return bind_failure(a);
    port_ = a.port;
  }
  thread_ = std::thread([this] { srv_->listen_after_bind(); });
  return Status::ok();
}

void MetricsHttp::publish(std::string text) {
  text_.store(std::make_shared<const std::string>(std::move(text)), std::memory_order_release);
}

void MetricsHttp::stop() {
  if (thread_.joinable()) {
    srv_->stop();
    thread_.join();
  }
}

}  // namespace tier::daemon
