#include "run_helper.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_fixture.hpp"

namespace tier::test {

namespace {

// Runs `cmd` (stdout: tier-train's JSON lines) with stderr captured.
TrainRun run(std::string cmd) {
  char tmpl[] = "/tmp/tier-train-test.XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  cmd += std::string(" 2>") + tmpl;
  TrainRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char line[4096];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    if (line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step")) continue;
    r.steps.push_back(j["step"].get<long>());
    r.losses.push_back(j["loss"].get<double>());
    if (j.contains("val_loss")) r.val_losses.push_back(j["val_loss"].get<double>());
  }
  const int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  std::ifstream err(tmpl);
  std::stringstream ss;
  ss << err.rdbuf();
  r.stderr_text = ss.str();
  std::remove(tmpl);
  return r;
}

std::string trainer_command(const std::string& args) {
  return bin_path("tier-train") + " --threads 1 " + args;
}

}  // namespace

TrainRun run_trainer(int ranks, const std::string& args) {
  std::string cmd;
  if (ranks > 1) cmd = std::string(kMpirun) + " -np " + std::to_string(ranks) + " -x OMP_NUM_THREADS=1 ";
  return run(cmd + trainer_command(args));
}

TrainRun run_trainer_on(const std::vector<std::string>& sockets, int ranks_per_daemon,
                        const std::string& args) {
  std::string cmd = kMpirun;
  for (size_t i = 0; i < sockets.size(); ++i)
    cmd += std::string(i == 0 ? " " : " : ") + "-np " + std::to_string(ranks_per_daemon) +
           " -x OMP_NUM_THREADS=1 -x TIERD_SOCKET=" + sockets[i] + " " + trainer_command(args);
  return run(cmd);
}

nlohmann::json plan_json(const std::string& args) {
  const std::string cmd = bin_path("tier-train") + " --plan --json " + args;
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return nlohmann::json::value_t::discarded;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (pclose(p) != 0) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(out, nullptr, false);
}

}  // namespace tier::test
