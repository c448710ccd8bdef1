#include "bench_common.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tier/types.hpp"
#include "base/sizes.hpp"

namespace tier::bench {

void emit(const BenchOptions& o, const Figure& f) { emit(o, f, ""); }

void emit(const BenchOptions& o, const Figure& f, const std::string& baseline_name) {
  nlohmann::ordered_json j;
  j["name"] = f.name;
  if (f.bytes) j["bytes"] = *f.bytes;
  j["value"] = f.value;
  j["unit"] = f.unit;
  j["baseline"] = f.baseline;
  j["ratio"] = f.ratio;
  if (!baseline_name.empty()) j["baseline_name"] = baseline_name;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  if (!o.json) {
    std::string size = f.bytes ? tier::format_size(*f.bytes) : std::string("-");
    std::fprintf(stderr, "%-28s %10s %14.3f %-9s baseline %14.3f  ratio %.3f%s%s\n", f.name.c_str(),
                 size.c_str(), f.value, f.unit.c_str(), f.baseline, f.ratio,
                 baseline_name.empty() ? "" : "  ", baseline_name.c_str());
  }
}

PairResult measure_pair(const std::function<bool()>& measured, const std::function<bool()>& baseline,
                        int iters, int samples) {
  std::vector<double> a, b;
  auto run = [&](const std::function<bool()>& fn, std::vector<double>& out) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < iters; ++i)
      if (!fn()) return false;
    clobber();
    out.push_back(static_cast<double>(now_ns() - t0) * 1e-9 / iters);
    return true;
  };
  for (int s = 0; s < samples; ++s) {
    bool ok = s % 2 == 0 ? run(measured, a) && run(baseline, b) : run(baseline, b) && run(measured, a);
    if (!ok) return {};
  }
  return {*std::min_element(a.begin(), a.end()), *std::min_element(b.begin(), b.end())};
}

bool pin(pid_t tid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::sched_setaffinity(tid, sizeof set, &set) == 0;
}

bool pin_process(pid_t pid, int cpu) {
  std::error_code ec;
  bool any = false;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    if (!pin(static_cast<pid_t>(std::stol(e.path().filename().string())), cpu)) return false;
    any = true;
  }
  return any;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

void unpin_self(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  if (!cpus.empty()) ::sched_setaffinity(0, sizeof set, &set);
}

std::string bench_pool_name(const char* suite) {
  return std::string("tier-bench.") + suite + "." + std::to_string(::getpid());
}

namespace {

std::string self_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

bool can_connect(const std::string& path) {
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

bool BenchDaemon::start(const BenchOptions& o, const std::string& ram) { return start(o, ram, {}); }

bool BenchDaemon::start(const BenchOptions& o, const std::string& ram,
                        const std::vector<std::string>& extra) {
  if (!o.socket.empty()) {
    socket_ = o.socket;
    return true;
  }
  std::string tierd = self_dir() + "/tierd";
  if (::access(tierd.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "tier-bench: no --socket given and no tierd next to tier-bench (%s)\n",
                 tierd.c_str());
    return false;
  }
  char tmpl[] = "/tmp/tier-bench.XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::fprintf(stderr, "tier-bench: mkdtemp: %s\n", std::strerror(errno));
    return false;
  }
  dir_ = tmpl;
  socket_ = dir_ + "/tierd.sock";
  std::string state = dir_ + "/state", log = dir_ + "/tierd.log";
  std::filesystem::create_directories(state);
  // Its state dir is removed at the end, so its arenas could never be attached again.
  std::vector<std::string> args = {tierd,         "--socket",     socket_,
                                   "--state-dir", state,          "--ram",
                                   ram,           "--foreground", "--remove-arenas-on-exit"};
  args.insert(args.end(), extra.begin(), extra.end());
  pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "tier-bench: fork: %s\n", std::strerror(errno));
    return false;
  }
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
  for (int i = 0; i < 1000; ++i) {  // up to 10 s
    int st;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      std::fprintf(stderr, "tier-bench: the private tierd exited at start; its log:\n%s", slurp(log).c_str());
      return false;
    }
    if (can_connect(socket_)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "tier-bench: the private tierd did not accept connections within 10 s\n");
  stop();
  return false;
}

void BenchDaemon::stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int st = 0;
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; ++i) {
      gone = ::waitpid(pid_, &st, WNOHANG) == pid_;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!gone) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

BenchDaemon::~BenchDaemon() { stop(); }

pid_t daemon_pid(const std::string& socket_path) {
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, socket_path.c_str(), sizeof a.sun_path - 1);
  pid_t pid = -1;
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    ucred c{};
    socklen_t len = sizeof c;
    if (::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &c, &len) == 0) pid = c.pid;
  }
  ::close(s);
  return pid;
}

double proc_status_kib(pid_t pid, const char* key) {
  if (pid <= 0) return -1;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line, k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::strtod(line.c_str() + k.size(), nullptr);
  return -1;
}

double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

}  // namespace tier::bench
