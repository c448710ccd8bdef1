// Warm restart: a rank killed (SIGKILL) anywhere in a step; `--resume` with the same job
// continues from the last committed step using the state in tierd, and every loss it prints
// is exactly the uninterrupted run's.
#include <catch2/catch.hpp>

#include <map>

#include "run_helper.hpp"
#include "support/daemon_fixture.hpp"

using tier::test::run_trainer;
using tier::test::TrainRun;

TEST_CASE("kill -9 of a rank at any point of a step, then --resume, gives the same losses", "[trainer][mpi][tier][restart]") {
  tier::test::TestDaemon daemon;
  REQUIRE(daemon.running());
  const std::string base = "--model tiny --steps 9 --batch 4 --lr 3e-3 --seed 3 --val-every -1 "
                           "--state tier --socket " + daemon.socket();
  const TrainRun ref = run_trainer(2, base + " --job ref");
  INFO(ref.stderr_text);
  REQUIRE(ref.exit_code == 0);
  REQUIRE(ref.losses.size() == 9);
  std::map<long, double> want;
  for (size_t i = 0; i < ref.steps.size(); ++i) want[ref.steps[i]] = ref.losses[i];

  struct Fault { int step; const char* point; int rank; };
  const Fault faults[] = {{2, "forward", 1}, {3, "backward", 0}, {4, "optimizer", 1},
                          {5, "precommit", 0}, {6, "postcommit", 1}, {1, "optimizer", 0}};
  int n = 0;
  for (const Fault& f : faults) {
    const std::string job = " --job crash" + std::to_string(n++);
    const std::string where = std::to_string(f.step) + ":" + f.point + ":" + std::to_string(f.rank);
    INFO("kill at " << where);
    const TrainRun a = run_trainer(2, base + job + " --fault-kill " + where);
    INFO(a.stderr_text);
    REQUIRE(a.exit_code != 0);
    const TrainRun b = run_trainer(2, base + job + " --resume");
    INFO(b.stderr_text);
    REQUIRE(b.exit_code == 0);
    REQUIRE(!b.steps.empty());
    // Resumes at the killed step, or after it when the kill came after its commit.
    CHECK(b.steps.front() >= f.step);
    CHECK(b.steps.front() <= f.step + 1);
    CHECK(b.steps.back() == 9);
    for (const TrainRun* r : {&a, &b})
      for (size_t i = 0; i < r->steps.size(); ++i) {
        INFO("step " << r->steps[i]);
        CHECK(r->losses[i] == want.at(r->steps[i]));
      }
  }
}

TEST_CASE("--resume refuses state written by another configuration", "[trainer][mpi][tier][restart]") {
  tier::test::TestDaemon daemon;
  const std::string base = "--model tiny --steps 3 --batch 4 --val-every -1 --state tier --job other --socket " + daemon.socket();
  REQUIRE(run_trainer(1, base).exit_code == 0);
  const TrainRun r = run_trainer(1, base + " --resume --seed 99");
  CHECK(r.exit_code != 0);
  CHECK(r.stderr_text.find("--resume") != std::string::npos);
}
