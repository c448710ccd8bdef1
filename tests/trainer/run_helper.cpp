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

TrainRun run_trainer(int ranks, const std::string& args) {
  char tmpl[] = "/tmp/tier-train-test.XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  std::string cmd;
  if (ranks > 1)
    cmd = std::string(kMpirun) + " -np " + std::to_string(ranks) +
          " -x OMP_NUM_THREADS=1 ";
  cmd += bin_path("tier-train") + " --threads 1 " + args + " 2>" + tmpl;
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

}  // namespace tier::test
