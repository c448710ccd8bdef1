#include "support/daemon_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "ram/arena.hpp"

namespace tier::test {

std::string bin_path(const std::string& name) {
  // A relocated test binary (the GPU bundle, tools/gpu-bundle) names its binaries' directory.
  const char* dir = std::getenv("TIER_TEST_BIN_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : TIER_BIN_DIR) + "/" + name;
}

namespace {

// Bytes allocated under `path` (a file or a directory tree), as du counts them.
uint64_t disk_bytes(const std::string& path) {
  uint64_t bytes = 0;
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (::lstat(it->path().c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  return bytes;
}

}  // namespace

void TestDaemon::report_held() const {
  if (pid_ <= 0 || std::getenv("TIER_SOAK_REPORT") == nullptr) return;
  uint64_t rss = 0;
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) rss = std::stoull(line.substr(6)) * 1024;
  uint64_t shm = 0;
  const std::string prefix = tier::daemon::arena_prefix(state_dir_) + "-";  // the daemon's own naming
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) shm += disk_bytes(e.path().string());
  uint64_t nvme = 0;
  for (size_t i = 0; i + 1 < opts_.extra_args.size(); ++i)
    if (opts_.extra_args[i] == "--nvme-dir") nvme += disk_bytes(opts_.extra_args[i + 1]);
  struct statvfs fs{};
  const uint64_t state_fs =
      ::statvfs(state_dir_.c_str(), &fs) == 0 ? static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize : 0;
  std::printf("soak-report-held: rss=%llu shm=%llu state=%llu nvme=%llu ram_tier=%s state_fs=%llu\n",
              static_cast<unsigned long long>(rss), static_cast<unsigned long long>(shm),
              static_cast<unsigned long long>(disk_bytes(state_dir_)), static_cast<unsigned long long>(nvme),
              opts_.ram.c_str(), static_cast<unsigned long long>(state_fs));
  std::fflush(stdout);
}

TestDaemon::TestDaemon(DaemonOptions opts) : opts_(std::move(opts)) {
  char tmpl[] = "/tmp/tierd-test.XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  socket_ = dir_ + "/tierd.sock";
  state_dir_ = dir_ + "/state";
  log_path_ = dir_ + "/tierd.log";
  std::filesystem::create_directories(state_dir_);
  if (!opts_.config.empty()) {
    const std::string cfg = dir_ + "/tierd.toml";
    std::ofstream(cfg) << opts_.config;
    opts_.extra_args.push_back("--config");
    opts_.extra_args.push_back(cfg);
  }
  start();
}

TestDaemon::~TestDaemon() {
  if (pid_ > 0) stop();
  // Arenas are named shared memory that outlives the daemon by design; remove this state
  // dir's arenas so the test suite leaves /dev/shm clean.
  std::string cleanup =
      bin_path("tierd") + " --state-dir '" + state_dir_ + "' --cleanup-arenas >/dev/null 2>&1";
  (void)!std::system(cleanup.c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void TestDaemon::start() {
  if (pid_ > 0) return;
  std::vector<std::string> args = {bin_path("tierd"), "--socket", socket_,   "--state-dir",
                                   state_dir_,        "--ram",    opts_.ram, "--foreground"};
  args.insert(args.end(), opts_.extra_args.begin(), opts_.extra_args.end());
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) {
      dup2(log, 2);
      dup2(log, 1);
    }
    for (const auto& e : opts_.env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
  if (opts_.wait_ready && !wait_ready())
    throw std::runtime_error("tierd did not become ready; log:\n" + log());
}

bool TestDaemon::wait_ready(int ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pid_ > 0) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
    }
    int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, socket_.c_str(), sizeof a.sun_path - 1);
    bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int TestDaemon::stop() {
  if (pid_ <= 0) return -1;
  report_held();
  ::kill(pid_, SIGTERM);
  int st = 0;
  for (int i = 0; i < 1000; ++i) {  // up to 10 s, then SIGKILL
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  waitpid(pid_, &st, 0);
  pid_ = -1;
  return st;
}

void TestDaemon::kill9() {
  if (pid_ <= 0) return;
  report_held();
  ::kill(pid_, SIGKILL);
  int st;
  waitpid(pid_, &st, 0);
  pid_ = -1;
}

std::string TestDaemon::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace tier::test
