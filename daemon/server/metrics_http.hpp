// Optional Prometheus HTTP listener (config metrics_listen = "127.0.0.1:9464"; off by default),
// on cpp-httplib, serving GET /metrics from its own thread.
//
// Threading: the event loop renders the exposition text and publish()es it (at start and on
// every tick); the HTTP thread only ever reads the last published text. The text is an
// immutable std::string behind std::atomic<std::shared_ptr<const std::string>>: publish() is a
// release store of a fully built string, a request's load() is an acquire load, so the reader
// sees a complete string, and the shared_ptr keeps it alive while it is sent even if a newer
// one is published meanwhile. Nothing else is shared with the event loop.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "core/listen_addr.hpp"
#include "tier/status.hpp"

namespace httplib {
class Server;
}

namespace tier::daemon {

class MetricsHttp {
 public:
  MetricsHttp();
  ~MetricsHttp();  // stops and joins
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  // Binds (synchronously, so a busy port is reported here) and starts the serving thread.
  [[nodiscard]] Status start(const ListenAddr& a);
  void publish(std::string text);
  void stop();
  int port() const noexcept { return port_; }

 private:
  std::unique_ptr<httplib::Server> srv_;
  std::thread thread_;
  std::atomic<std::shared_ptr<const std::string>> text_;
  int port_ = 0;
};

}  // namespace tier::daemon
