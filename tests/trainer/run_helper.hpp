// Runs tier-train (under mpirun for R > 1) and parses its JSON step lines.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tier::test {

struct TrainRun {
  int exit_code = -1;
  std::vector<long> steps;
  std::vector<double> losses;
  std::vector<double> val_losses;  // those steps that reported one
  std::string stderr_text;
};

// How the tests start mpirun (local, as root too). Leak checking is off in the ranks it
// starts: under ASan, Open MPI's plugins leak at exit and are unloaded before LeakSanitizer
// reports, so their stacks end in "<unknown module>" and cannot be suppressed by name. The same
// tier-train code is leak-checked in the single-process runs; ASan and UBSan stay on in ranks.
inline constexpr const char* kMpirun =
    "env LSAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root --oversubscribe";

// `args` are tier-train's arguments; ranks > 1 runs it under mpirun -np ranks.
TrainRun run_trainer(int ranks, const std::string& args);

// `args` under one MPMD mpirun line: ranks_per_daemon ranks for each socket in turn, each with
// TIERD_SOCKET set to it (so `args` must not name --socket), as on nodes with one tierd each.
TrainRun run_trainer_on(const std::vector<std::string>& sockets, int ranks_per_daemon,
                        const std::string& args);

// `tier-train --plan --json ARGS`: the plan's object, or a discarded value when tier-train
// failed or printed no JSON.
nlohmann::json plan_json(const std::string& args);

}  // namespace tier::test
