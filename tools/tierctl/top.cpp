// tierctl top: a live view of one tierd, redrawn every --interval seconds with ANSI clear +
// home: RAM tier per NUMA node, NVMe tier per directory, NVMe bandwidth and request rate (deltas
// between two refreshes), and the pools using the most RAM. 'q' or Ctrl-C quits; --once prints
// one frame without clearing (rates then read "-": there is no previous frame to subtract).
#include <poll.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "table.hpp"

namespace tier::ctl {

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

std::string pct(uint64_t used, uint64_t cap) {
  if (cap == 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * static_cast<double>(used) / static_cast<double>(cap));
  return b;
}

std::string bar(uint64_t used, uint64_t cap, int width = 20) {
  int n = cap == 0 ? 0 : static_cast<int>(static_cast<double>(width) * static_cast<double>(used) / static_cast<double>(cap) + 0.5);
  n = std::clamp(n, 0, width);
  return "[" + std::string(static_cast<size_t>(n), '#') + std::string(static_cast<size_t>(width - n), '.') + "]";
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

Status frame(Client& c, Prev& prev, size_t top_n) {
  auto s = c.status();
  if (!s) return s.error();
  auto pools = c.list_pools();
  if (!pools) return pools.error();
  auto now = std::chrono::steady_clock::now();
  double dt = prev.valid ? std::chrono::duration<double>(now - prev.at).count() : 0;
  auto per_s = [&](uint64_t cur, uint64_t old) {
    return prev.valid && dt > 0 ? static_cast<double>(cur - std::min(cur, old)) / dt : -1.0;
  };
  std::printf("tierd %s at %s — %u client(s), %u pool(s), %llu lease(s)\n\n", s->daemon_version.c_str(),
              c.socket_path().c_str(), s->clients, s->pools, static_cast<unsigned long long>(s->leases));
  std::printf("RAM tier\n");
  Table ram({"NODE", "USED", "CAPACITY", "USE", "", "DIRTY", "TENSORS"}, {true, true, true, true, false, true, true});
  uint64_t used = 0, cap = 0;
  for (const auto& r : s->ram) {
    used += r.used;
    cap += r.capacity;
    ram.add({std::to_string(r.node), format_size(r.used), format_size(r.capacity), pct(r.used, r.capacity),
             bar(r.used, r.capacity), format_size(r.dirty), std::to_string(r.tensors)});
  }
  ram.add({"all", format_size(used), format_size(cap), pct(used, cap), bar(used, cap), "", ""});
  ram.print(stdout, "  ");
  std::printf("\nNVMe tier\n");
  if (s->nvme.empty()) {
    std::printf("  (none configured)\n");
  } else {
    Table nv({"PATH", "NODE", "USED", "CAPACITY", "USE"}, {false, true, true, true, true});
    for (const auto& n : s->nvme)
      nv.add({n.path, n.numa_node < 0 ? "-" : std::to_string(n.numa_node), format_size(n.used),
              format_size(n.capacity), pct(n.used, n.capacity)});
    nv.print(stdout, "  ");
  }
  double rps = per_s(s->requests, prev.requests);
  std::printf("\nBandwidth  NVMe read %s  NVMe write %s  requests %s\n",
              rate(per_s(s->bytes_read, prev.read)).c_str(), rate(per_s(s->bytes_written, prev.written)).c_str(),
              rps < 0 ? "-" : (std::to_string(static_cast<uint64_t>(rps)) + "/s").c_str());
  std::printf("Counters   hits %llu  misses %llu  stalls %llu  evictions %llu  prefetches %llu  errors %llu\n",
              static_cast<unsigned long long>(s->hits), static_cast<unsigned long long>(s->misses),
              static_cast<unsigned long long>(s->stalls), static_cast<unsigned long long>(s->evictions),
              static_cast<unsigned long long>(s->prefetches), static_cast<unsigned long long>(s->errors));
  std::vector<PoolInfo> ps = std::move(*pools);
  std::sort(ps.begin(), ps.end(), [](const PoolInfo& a, const PoolInfo& b) {
    return a.ram_used != b.ram_used ? a.ram_used > b.ram_used : a.name < b.name;
  });
  std::printf("\nTop pools by RAM (%zu of %zu)\n", std::min(top_n, ps.size()), ps.size());
  Table tp({"POOL", "OWNER", "TENSORS", "RAM USED", "RAM QUOTA", "USE", "NVME USED"},
           {false, true, true, true, true, true, true});
  for (size_t i = 0; i < ps.size() && i < top_n; ++i)
    tp.add({ps[i].name, std::to_string(ps[i].owner_uid), std::to_string(ps[i].tensor_count),
            format_size(ps[i].ram_used), format_size(ps[i].ram_quota), pct(ps[i].ram_used, ps[i].ram_quota),
            format_size(ps[i].nvme_used)});
  tp.print(stdout, "  ");
  prev = {true, s->bytes_read, s->bytes_written, s->requests, now};
  return Status::ok();
}

}  // namespace

Status cmd_top(Client& c, double interval_s, bool once, size_t top_n) {
  Prev prev;
  if (once) return frame(c, prev, top_n);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  termios old{};
  bool tty = ::isatty(0) && ::tcgetattr(0, &old) == 0;
  if (tty) {
    termios raw = old;
    raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    ::tcsetattr(0, TCSANOW, &raw);
  }
  Status st;
  while (!g_stop.load()) {
    std::printf("\x1b[H\x1b[2J");
    st = frame(c, prev, top_n);
    if (!st.is_ok()) break;
    std::printf("\n(refresh every %.1f s; q or Ctrl-C quits)\n", interval_s);
    std::fflush(stdout);
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(interval_s);
    while (!g_stop.load()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      pollfd p{0, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) > 0 && (p.revents & POLLIN)) {
        char ch = 0;
        if (::read(0, &ch, 1) == 1 && (ch == 'q' || ch == 'Q')) g_stop.store(true);
        else if (!tty) break;  // stdin at EOF and not a terminal: just keep the interval
      }
    }
  }
  if (tty) ::tcsetattr(0, TCSANOW, &old);
  return st;
}

}  // namespace tier::ctl
