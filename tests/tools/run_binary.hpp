// Runs a built binary (or script) with arguments and extra environment, capturing its exit code,
// stdout and stderr, for the tools tests. Blocks until it exits; kills it after `timeout_s`.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tier::test {

struct RunResult {
  int rc = -1;  // exit code; 128 + signal when killed
  std::string out, err;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline RunResult run_binary(const std::string& exe, const std::vector<std::string>& args,
                            const std::vector<std::string>& env = {}, int timeout_s = 60) {
  char tmpl[] = "/tmp/tier-run.XXXXXX";
  RunResult r;
  if (!mkdtemp(tmpl)) return r;
  std::string dir = tmpl, out = dir + "/out", err = dir + "/err";
  pid_t pid = fork();
  if (pid == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    for (const auto& kv : env) {
      auto eq = kv.find('=');
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    }
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    std::string e0 = exe;
    argv.push_back(e0.data());
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  int st = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    if (waitpid(pid, &st, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = read_text(out);
  r.err = read_text(err);
  ::unlink(out.c_str());
  ::unlink(err.c_str());
  ::rmdir(dir.c_str());
  return r;
}

}  // namespace tier::test
