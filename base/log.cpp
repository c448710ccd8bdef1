#include "base/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace tier {

namespace {
std::atomic<int> g_max_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_journal{false};
LogSink& sink() {
  static LogSink s;
  return s;
}
}  // namespace

void set_log_level(LogLevel max) noexcept { g_max_level.store(static_cast<int>(max)); }

void init_logging() noexcept {
  const char* js = std::getenv("JOURNAL_STREAM");
  g_journal.store(js != nullptr && *js != '\0');
  const char* dbg = std::getenv("TIERD_DEBUG");
  if (dbg && *dbg && *dbg != '0') set_log_level(LogLevel::kDebug);
}

void set_log_sink(LogSink s) { sink() = std::move(s); }

void log_line(LogLevel level, std::string_view text) noexcept {
  if (static_cast<int>(level) > g_max_level.load(std::memory_order_relaxed)) return;
  try {
    if (const LogSink& s = sink()) {
      s(level, text);
      return;
    }
    std::string line;
    line.reserve(text.size() + 16);
    if (g_journal.load(std::memory_order_relaxed)) {
      line += '<';
      line += static_cast<char>('0' + static_cast<int>(level));
      line += '>';
    } else {
      switch (level) {
        case LogLevel::kError: line += "tierd: error: "; break;
        case LogLevel::kWarning: line += "tierd: warning: "; break;
        case LogLevel::kInfo: line += "tierd: "; break;
        case LogLevel::kDebug: line += "tierd: debug: "; break;
      }
    }
    line.append(text);
    line += '\n';
    ssize_t r = ::write(2, line.data(), line.size());
    (void)r;
  } catch (...) {
    // Logging must never take the daemon down; an allocation failure drops the line.
  }
}

}  // namespace tier
