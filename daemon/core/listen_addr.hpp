// The metrics listener's address (config metrics_listen): parsed and checked with the config,
// served by server/metrics_http.hpp.
#pragma once

#include <string>

#include "tier/status.hpp"

namespace tier::daemon {

// "127.0.0.1:9464", "[::1]:9464", "localhost:9464": only loopback addresses are accepted.
struct ListenAddr {
  std::string host;
  int port = 0;
};
[[nodiscard]] Result<ListenAddr> parse_metrics_listen(const std::string& s);

}  // namespace tier::daemon
