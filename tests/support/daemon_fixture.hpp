// Starts a real tierd for an integration test: a temporary directory holds its socket and
// state dir; the daemon is killed (SIGTERM, then SIGKILL) and the directory removed when the
// fixture is destroyed. Not thread-safe; one fixture per test case.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tier::test {

struct DaemonOptions {
  std::string ram = "256M";             // --ram
  std::vector<std::string> extra_args;  // appended to the command line
  std::vector<std::string> env;         // "NAME=value" added to the daemon's environment
  bool wait_ready = true;               // wait until the socket accepts connections
  // TOML for `--config`: when not empty, written to tierd.toml in the fixture's own directory
  // (private to this daemon, removed with it; a shared path would let tests running at the same
  // time start each other's configuration).
  std::string config;

  // A daemon started with `--config PATH`.
  static DaemonOptions with_config(const std::string& path, bool wait_ready = true) {
    DaemonOptions o;
    o.extra_args = {"--config", path};
    o.wait_ready = wait_ready;
    return o;
  }
};

class TestDaemon {
 public:
  explicit TestDaemon(DaemonOptions opts = {});
  ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& state_dir() const { return state_dir_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Starts (again) with the same directory; a no-op when already running.
  void start();
  // SIGTERM and wait; returns the exit status as from waitpid (or -1 when not running).
  int stop();
  // SIGKILL and reap: a crash.
  void kill9();
  // Waits until connect() on the socket succeeds; false after `ms`.
  bool wait_ready(int ms = 10000);
  // The daemon's stderr so far.
  std::string log() const;

 private:
  // With $TIER_SOAK_REPORT set (tools/soak), prints one "soak-report-held:" line of what the
  // running daemon holds: its peak RSS, its arenas in /dev/shm, its state dir and NVMe dirs on
  // disk, and its limits: the RAM tier it was given and the size of its state dir's file
  // system. Called before each stop and kill -9.
  void report_held() const;

  DaemonOptions opts_;
  std::string dir_, socket_, state_dir_, log_path_;
  pid_t pid_ = -1;
};

// Path to a binary built into build/bin, or into $TIER_TEST_BIN_DIR when that is set.
std::string bin_path(const std::string& name);

}  // namespace tier::test
