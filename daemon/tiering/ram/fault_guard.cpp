#include "ram/fault_guard.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace tier::daemon::fault_guard {

namespace {

// A slot is published by storing `live` last (release) and read by the handler after loading
// `live` (acquire). 4096 slots: one per (pool, NUMA node) arena a daemon has mapped at once.
struct Slot {
  std::atomic<bool> taken{false};  // owned by an add() (set before the fields are written)
  std::atomic<bool> live{false};   // the handler may use the fields
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> len{0};
  std::atomic<int> fd{-1};
  std::atomic<uint64_t> committed{0};
  std::atomic<uint64_t> repairs{0};
  char line[192] = {};  // "tierd: arena NAME was truncated ...\n", written by add()
  size_t line_len = 0;
};

constexpr int kSlots = 4096;
Slot g_slots[kSlots];
std::atomic<int> g_high{0};  // slots [0, g_high) may be live
struct sigaction g_prev{};

void chain(int sig, siginfo_t* si, void* uc) {
  if (g_prev.sa_flags & SA_SIGINFO) {
    if (g_prev.sa_sigaction) return g_prev.sa_sigaction(sig, si, uc);
  } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
    return g_prev.sa_handler(sig);
  }
  // The default action: returning re-executes the access, which faults again and kills us
  // with SIGBUS as if no handler had been installed (core dump included).
  ::signal(SIGBUS, SIG_DFL);
}

void on_sigbus(int sig, siginfo_t* si, void* uc) {
  int saved = errno;
  auto addr = reinterpret_cast<uintptr_t>(si->si_addr);
  int high = g_high.load(std::memory_order_acquire);
  for (int i = 0; i < high; ++i) {
    Slot& s = g_slots[i];
    if (!s.live.load(std::memory_order_acquire)) continue;
    uintptr_t base = s.base.load(std::memory_order_relaxed);
    if (addr < base || addr - base >= s.len.load(std::memory_order_relaxed)) continue;
    uint64_t want = s.committed.load(std::memory_order_relaxed);
    int fd = s.fd.load(std::memory_order_relaxed);
    struct stat sb;
    if (addr - base < want && ::fstat(fd, &sb) == 0 && static_cast<uint64_t>(sb.st_size) < want &&
        ::ftruncate(fd, static_cast<off_t>(want)) == 0) {
      s.repairs.fetch_add(1, std::memory_order_relaxed);
      [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, s.line, s.line_len);
      errno = saved;
      return;  // the access is retried and now finds a (zero) page
    }
    break;  // an arena fault the guard cannot repair
  }
  errno = saved;
  chain(sig, si, uc);
}

}  // namespace

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa{};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // NODEFER: a fault while chaining still kills
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_prev);
  });
}

int add(const std::byte* base, uint64_t len, int fd, uint64_t committed, const char* name) {
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    bool expect = false;
    if (!s.taken.compare_exchange_strong(expect, true, std::memory_order_acq_rel)) continue;
    s.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_relaxed);
    s.len.store(len, std::memory_order_relaxed);
    s.fd.store(fd, std::memory_order_relaxed);
    s.committed.store(committed, std::memory_order_relaxed);
    s.repairs.store(0, std::memory_order_relaxed);
    static constexpr const char kHead[] = "tierd: arena ";
    static constexpr const char kTail[] =
        " was truncated through a tenant's fd; its size is restored (the lost bytes read as zeros)\n";
    size_t room = sizeof s.line - (sizeof kHead - 1) - (sizeof kTail - 1);
    size_t n = std::min(std::strlen(name), room);
    std::memcpy(s.line, kHead, sizeof kHead - 1);
    std::memcpy(s.line + sizeof kHead - 1, name, n);
    std::memcpy(s.line + sizeof kHead - 1 + n, kTail, sizeof kTail - 1);
    s.line_len = sizeof kHead - 1 + n + sizeof kTail - 1;
    int high = g_high.load(std::memory_order_relaxed);
    while (high < i + 1 && !g_high.compare_exchange_weak(high, i + 1, std::memory_order_acq_rel)) {}
    s.live.store(true, std::memory_order_release);
    return i;
  }
  return -1;
}

void set_committed(int slot, uint64_t committed) {
  if (slot >= 0) g_slots[slot].committed.store(committed, std::memory_order_release);
}

uint64_t repairs(int slot) { return slot >= 0 ? g_slots[slot].repairs.load(std::memory_order_relaxed) : 0; }

void remove(int slot) {
  if (slot < 0) return;
  g_slots[slot].live.store(false, std::memory_order_release);
  g_slots[slot].taken.store(false, std::memory_order_release);
}

}  // namespace tier::daemon::fault_guard
