// tierctl top: a live view of one tierd: RAM tier per NUMA node, NVMe tier per directory, NVMe
// bandwidth and request rate (deltas between two refreshes), and the pools using the most RAM.
//
// On a terminal it draws in the alternate screen, clips each frame to the window, and reads 'q'
// from the keyboard. Off a terminal (a pipe, a file, </dev/null) it never reads stdin: frames
// follow one another every --interval, so `tierctl top | tee log` records the node and a closed
// or empty stdin cannot turn the wait into a busy loop. --once prints one frame (rates read "-":
// there is no previous frame to subtract); --json prints JSON objects instead of tables.
#include <poll.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "base/errors.hpp"
#include "table.hpp"
#include "base/sizes.hpp"

namespace tier::ctl {

namespace {

// Set by SIGINT/SIGTERM; relaxed suffices: it is only polled, and guards no other data.
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true, std::memory_order_relaxed); }
bool stopping() { return g_stop.load(std::memory_order_relaxed); }

std::string pct(uint64_t used, uint64_t cap) {
  if (cap == 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * static_cast<double>(used) / static_cast<double>(cap));
  return b;
}

std::string bar(uint64_t used, uint64_t cap, int width = 20) {
  int n = cap == 0
              ? 0
              : static_cast<int>(
                    static_cast<double>(width) * static_cast<double>(used) / static_cast<double>(cap) + 0.5);
  n = std::clamp(n, 0, width);
  return "[" + std::string(static_cast<size_t>(n), '#') + std::string(static_cast<size_t>(width - n), '.') +
         "]";
}

std::string rate(double bytes_per_s) {
  if (bytes_per_s < 0) return "-";
  return format_size(static_cast<uint64_t>(bytes_per_s)) + "/s";
}

struct Prev {
  bool valid = false;
  uint64_t read = 0, written = 0, requests = 0;
  std::chrono::steady_clock::time_point at;
};

// One sample of the node: what a frame shows, taken in two requests.
struct Sample {
  NodeStatus status;
  std::vector<PoolInfo> pools;  // sorted by RAM used, largest first
  std::chrono::steady_clock::time_point at;
};

Result<Sample> sample(Client& c) {
  auto s = c.status();
  TIER_TRY(s);
  auto pools = c.list_pools();
  TIER_TRY(pools);
  Sample out{std::move(*s), std::move(*pools), std::chrono::steady_clock::now()};
  std::sort(out.pools.begin(), out.pools.end(), [](const PoolInfo& a, const PoolInfo& b) {
    return a.ram_used != b.ram_used ? a.ram_used > b.ram_used : a.name < b.name;
  });
  return out;
}

// The JSON form of a frame: the node's status (as `tierctl --json status`) and the top pools.
nlohmann::json frame_json(const Sample& smp, const std::string& socket, size_t top_n) {
  nlohmann::json pools = nlohmann::json::array();
  for (size_t i = 0; i < smp.pools.size() && i < top_n; ++i) pools.push_back(pool_json(smp.pools[i]));
  return {
      {"status", status_json(smp.status, socket)}, {"top_pools", pools}, {"pools_total", smp.pools.size()}};
}

void frame(std::FILE* out, const std::string& socket, const Sample& smp, Prev& prev, size_t top_n) {
  const NodeStatus* s = &smp.status;
  auto now = smp.at;
  double dt = prev.valid ? std::chrono::duration<double>(now - prev.at).count() : 0;
  auto per_s = [&](uint64_t cur, uint64_t old) {
    return prev.valid && dt > 0 ? static_cast<double>(cur - std::min(cur, old)) / dt : -1.0;
  };
  std::fprintf(out, "tierd %s at %s — %u client(s), %u pool(s), %llu lease(s)\n\n", s->daemon_version.c_str(),
               socket.c_str(), s->clients, s->pools, static_cast<unsigned long long>(s->leases));
  std::fprintf(out, "RAM tier\n");
  Table ram({"NODE", "USED", "CAPACITY", "USE", "", "DIRTY", "TENSORS"},
            {true, true, true, true, false, true, true});
  uint64_t used = 0, cap = 0;
  for (const auto& r : s->ram) {
    used += r.used;
    cap += r.capacity;
    ram.add({std::to_string(r.node), format_size(r.used), format_size(r.capacity), pct(r.used, r.capacity),
             bar(r.used, r.capacity), format_size(r.dirty), std::to_string(r.tensors)});
  }
  ram.add({"all", format_size(used), format_size(cap), pct(used, cap), bar(used, cap), "", ""});
  ram.print(out, "  ");
  std::fprintf(out, "\nNVMe tier\n");
  if (s->nvme.empty()) {
    std::fprintf(out, "  (none configured)\n");
  } else {
    Table nv({"PATH", "NODE", "USED", "CAPACITY", "USE"}, {false, true, true, true, true});
    for (const auto& n : s->nvme)
      nv.add({n.path, n.numa_node < 0 ? "-" : std::to_string(n.numa_node), format_size(n.used),
              format_size(n.capacity), pct(n.used, n.capacity)});
    nv.print(out, "  ");
  }
  double rps = per_s(s->requests, prev.requests);
  std::fprintf(out, "\nBandwidth  NVMe read %s  NVMe write %s  requests %s\n",
               rate(per_s(s->bytes_read, prev.read)).c_str(),
               rate(per_s(s->bytes_written, prev.written)).c_str(),
               rps < 0 ? "-" : (std::to_string(static_cast<uint64_t>(rps)) + "/s").c_str());
  std::fprintf(
      out, "Counters   hits %llu  misses %llu  stalls %llu  evictions %llu  prefetches %llu  errors %llu\n",
      static_cast<unsigned long long>(s->hits), static_cast<unsigned long long>(s->misses),
      static_cast<unsigned long long>(s->stalls), static_cast<unsigned long long>(s->evictions),
      static_cast<unsigned long long>(s->prefetches), static_cast<unsigned long long>(s->errors));
  const std::vector<PoolInfo>& ps = smp.pools;
  std::fprintf(out, "\nTop pools by RAM (%zu of %zu)\n", std::min(top_n, ps.size()), ps.size());
  Table tp({"POOL", "OWNER", "TENSORS", "RAM USED", "RAM QUOTA", "USE", "NVME USED"},
           {false, true, true, true, true, true, true});
  for (size_t i = 0; i < ps.size() && i < top_n; ++i)
    tp.add({ps[i].name, owner_name(ps[i].owner_uid), std::to_string(ps[i].tensor_count),
            format_size(ps[i].ram_used), format_size(ps[i].ram_quota), pct(ps[i].ram_used, ps[i].ram_quota),
            format_size(ps[i].nvme_used)});
  tp.print(out, "  ");
  prev = {true, s->bytes_read, s->bytes_written, s->requests, now};
}

// The terminal's size, or 0x0 when stdout is not one.
struct WinSize {
  size_t cols = 0, rows = 0;
};
WinSize window() {
  winsize w{};
  if (::ioctl(1, TIOCGWINSZ, &w) != 0 || w.ws_col == 0) return {};
  return {w.ws_col, w.ws_row};
}

// `text` with every line cut to `cols` display columns (UTF-8: a column per code point; the
// frame holds no wide characters) and at most `rows` lines; 0 means no limit.
std::string clip(const std::string& text, size_t cols, size_t rows) {
  std::string out;
  size_t col = 0, line = 0;
  for (char ch : text) {
    if (ch == '\n') {
      if (rows != 0 && ++line >= rows) break;
      out += ch;
      col = 0;
      continue;
    }
    bool continuation = (static_cast<unsigned char>(ch) & 0xC0) == 0x80;
    if (!continuation) ++col;
    if (cols == 0 || col <= cols) out += ch;
  }
  return out;
}

std::string render(const std::string& socket, const Sample& smp, Prev& prev, size_t top_n) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* mem = ::open_memstream(&buf, &len);
  if (mem == nullptr) return {};
  frame(mem, socket, smp, prev, top_n);
  std::fclose(mem);
  std::string text(buf, len);
  std::free(buf);
  return text;
}

// Writes all of `text`; false once stdout is gone (a closed pipe), which ends the loop.
bool emit(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) return false;
  return std::fflush(stdout) == 0;
}

// Sleeps until `until`, or until 'q', a signal, or (with `keyboard`) stdin closing. A stdin
// that hangs up or reaches EOF stops being polled; the sleep itself always lasts the interval.
void wait_until(std::chrono::steady_clock::time_point until, bool& keyboard) {
  while (!stopping()) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now())
            .count();
    if (left <= 0) return;
    pollfd p{keyboard ? 0 : -1, POLLIN, 0};  // fd -1: poll only sleeps
    int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n <= 0 || !keyboard) continue;  // timeout, EINTR (a signal sets g_stop), or no keyboard
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) {
      keyboard = false;
      continue;
    }
    char ch = 0;
    ssize_t r = ::read(0, &ch, 1);
    if (r == 0) keyboard = false;
    else if (r == 1 && (ch == 'q' || ch == 'Q')) g_stop.store(true, std::memory_order_relaxed);
  }
}

}  // namespace

Status cmd_top(Client& c, const Output& o, const TopOptions& t) {
  const size_t top_n = static_cast<size_t>(std::max(t.pools, 0));
  const std::string socket = c.socket_path();
  Prev prev;
  auto once = [&]() -> Status {
    auto smp = sample(c);
    TIER_TRY(smp);
    std::string text =
        o.json ? frame_json(*smp, socket, top_n).dump() + "\n" : render(socket, *smp, prev, top_n);
    return emit(text) ? Status::ok() : Status::from_errno(errno, "write to stdout");
  };
  if (t.once) return once();

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const bool screen = !o.json && ::isatty(1);  // draw in place only on a terminal
  termios old{};
  bool keyboard = ::isatty(0) && ::tcgetattr(0, &old) == 0;
  const bool restore_tty = keyboard;
  if (keyboard) {
    termios raw = old;
    raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    ::tcsetattr(0, TCSANOW, &raw);
  }
  if (screen) emit("\x1b[?1049h");  // the alternate screen: the shell's screen comes back on exit
  Status st;
  bool first = true;
  while (!stopping()) {
    auto until =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(t.interval_s));
    auto smp = sample(c);
    if (!smp) {
      st = smp.error();
      break;
    }
    std::string text;
    if (o.json) {
      text = frame_json(*smp, socket, top_n).dump() + "\n";
    } else if (screen) {
      char foot[96];
      std::snprintf(foot, sizeof foot, "\n(refresh every %.1f s; %s)\n", t.interval_s,
                    keyboard ? "q or Ctrl-C quits" : "Ctrl-C quits");
      WinSize w = window();
      text = "\x1b[H\x1b[2J" + clip(render(socket, *smp, prev, top_n) + foot, w.cols, w.rows);
    } else {
      text = (first ? "" : "\n") + render(socket, *smp, prev, top_n);
    }
    first = false;
    if (!emit(text)) break;  // stdout closed: nobody is watching any more
    wait_until(until, keyboard);
  }
  if (screen) emit("\x1b[?1049l");
  if (restore_tty) ::tcsetattr(0, TCSANOW, &old);
  return st;
}

}  // namespace tier::ctl
