// Daemon logging: one line per event on stderr.
//
// When stderr is connected to journald ($JOURNAL_STREAM is set) each line is prefixed with its
// syslog priority ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug) so the journal records
// the right level. Thread-safe: each line is written with a single write(2).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace tier::daemon {

enum class LogLevel : int { kError = 3, kWarning = 4, kInfo = 6, kDebug = 7 };

// Lines above `max` (numerically) are dropped. Default kInfo; $TIERD_DEBUG=1 enables kDebug.
void set_log_level(LogLevel max) noexcept;
// Re-reads $JOURNAL_STREAM; called once at start (tests call it after setenv).
void init_logging() noexcept;
void log_line(LogLevel level, std::string_view text) noexcept;

template <class... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tier::daemon
