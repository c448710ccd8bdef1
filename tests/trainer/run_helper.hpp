// Runs tier-train (under mpirun for R > 1) and parses its JSON step lines.
#pragma once

#include <string>
#include <vector>

namespace tier::test {

struct TrainRun {
  int exit_code = -1;
  std::vector<long> steps;
  std::vector<double> losses;
  std::vector<double> val_losses;  // those steps that reported one
  std::string stderr_text;
};

// `args` are tier-train's arguments; ranks > 1 runs it under mpirun -np ranks.
TrainRun run_trainer(int ranks, const std::string& args);

}  // namespace tier::test
