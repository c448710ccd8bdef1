// tier_log: the one logger of tierd, shared by the daemon core and the libraries below it
// (tier_nvme). One line per event on stderr; depends on fmt only.
//
// When stderr is connected to journald ($JOURNAL_STREAM is set) each line is prefixed with its
// syslog priority ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug) so the journal records
// the right level; otherwise with "tierd: " plus the level ("tierd: warning: ..."). Lines of a
// library carry its name first ("nvme: ...").
//
// Thread-safety: logging may happen from any thread (NVMe I/O workers log too); each line is
// written with a single write(2), so lines never interleave. set_log_level() may be called at
// any time. init_logging() and set_log_sink() are not safe against concurrent logging: call
// them before threads start logging.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>
#include <utility>

namespace tier {

enum class LogLevel : int { kError = 3, kWarning = 4, kInfo = 6, kDebug = 7 };

// Lines above `max` (numerically) are dropped. Default kInfo; $TIERD_DEBUG=1 enables kDebug
// (read by init_logging()), the daemon's config `log_level` sets it too.
void set_log_level(LogLevel max) noexcept;
// Re-reads $JOURNAL_STREAM and $TIERD_DEBUG; called once at start (tests call it after setenv).
void init_logging() noexcept;

// Where kept lines go instead of stderr: gets the level and the text without any prefix or
// newline. It may be called from any thread, so it must be thread-safe. An empty function
// restores stderr. Meant for tests and embedders that capture lines.
using LogSink = std::function<void(LogLevel level, std::string_view text)>;
void set_log_sink(LogSink sink);

void log_line(LogLevel level, std::string_view text) noexcept;

// log_error("...{}...", x) etc.: fmt-style, checked at compile time, one line each.
template <LogLevel L> struct LogAt {
  template <class... Args> void operator()(fmt::format_string<Args...> f, Args&&... args) const {
    log_line(L, fmt::format(f, std::forward<Args>(args)...));
  }
};
inline constexpr LogAt<LogLevel::kError> log_error{};
inline constexpr LogAt<LogLevel::kWarning> log_warn{};
inline constexpr LogAt<LogLevel::kInfo> log_info{};
inline constexpr LogAt<LogLevel::kDebug> log_debug{};

}  // namespace tier
