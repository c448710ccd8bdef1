#include "nvme/nvme_log.hpp"

#include <unistd.h>

#include <atomic>
#include <string>

namespace tier::nvme {
namespace {
LogSink& sink() {
  static LogSink s;
  return s;
}
std::atomic<int> g_max_level{6};
}  // namespace

void set_nvme_log_sink(LogSink s) { sink() = std::move(s); }
void set_nvme_log_level(int max) noexcept { g_max_level.store(max, std::memory_order_relaxed); }

void nvme_log(int level, std::string_view line) {
  if (level > g_max_level.load(std::memory_order_relaxed)) return;
  if (sink()) {
    sink()(level, line);
    return;
  }
  std::string text = "tierd nvme: ";
  text.append(line);
  text.push_back('\n');
  // One write(2) per line so lines from I/O threads do not interleave.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
}

}  // namespace tier::nvme
