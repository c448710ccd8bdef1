#include "core/listen_addr.hpp"

#include <charconv>
#include <string_view>

#include "base/errors.hpp"

namespace tier::daemon {

Result<ListenAddr> parse_metrics_listen(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return fail(Code::kInvalidArgument, "metrics_listen '" + s + "' is not HOST:PORT");
  ListenAddr a;
  a.host = s.substr(0, colon);
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']')
    a.host = a.host.substr(1, a.host.size() - 2);
  std::string_view ps(s);
  ps.remove_prefix(colon + 1);
  auto [p, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), a.port);
  if (ec != std::errc() || p != ps.data() + ps.size() || a.port < 0 || a.port > 65535)
    return fail(Code::kInvalidArgument, "metrics_listen '" + s + "': bad port");
  bool loopback = a.host == "localhost" || a.host == "::1" || a.host.rfind("127.", 0) == 0;
  if (!loopback)
    return fail(Code::kInvalidArgument,
                "metrics_listen '" + s +
                    "': only loopback addresses (127.0.0.0/8, ::1, localhost) are served; "
                    "put a proxy in front to expose metrics further");
  return a;
}

}  // namespace tier::daemon
