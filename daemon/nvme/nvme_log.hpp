// Logging hook of the NVMe tier library.
//
// tier_nvme does not depend on the daemon's logger: it emits lines through a sink that the
// daemon installs once at start (set_nvme_log_sink). Until then lines go to stderr. Levels are
// syslog priorities (3 error, 4 warning, 6 info, 7 debug). The sink may be called from any thread
// (I/O worker threads log too), so it must be thread-safe; the default one is.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

namespace tier::nvme {

using LogSink = std::function<void(int level, std::string_view line)>;

// Installs `sink` (an empty function restores the stderr default). Not thread-safe against
// concurrent logging: call before any engine is opened.
void set_nvme_log_sink(LogSink sink);
// Lines with a level numerically above `max` are dropped (default 6: info).
void set_nvme_log_level(int max) noexcept;
void nvme_log(int level, std::string_view line);

template <class... Args>
void nlog_error(fmt::format_string<Args...> f, Args&&... args) {
  nvme_log(3, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void nlog_warn(fmt::format_string<Args...> f, Args&&... args) {
  nvme_log(4, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void nlog_info(fmt::format_string<Args...> f, Args&&... args) {
  nvme_log(6, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void nlog_debug(fmt::format_string<Args...> f, Args&&... args) {
  nvme_log(7, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tier::nvme
