// Every --model preset once. Those whose state and working set fit the test machine's budget
// (asked of --plan itself, for one CPU rank with 2 GiB and no NVMe) train a few steps with a
// short --seq and the loss must fall; the others must be refused by --plan with a reason,
// without being run.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "run_helper.hpp"
#include "support/daemon_fixture.hpp"

using tier::test::run_trainer;

namespace {

// Short sequences keep the activations small; the parameters are the preset's but for wpe.
constexpr int kSeq = 16;
// The machine as --plan sees it: one rank, 2 GiB for its state and for its working set.
const std::string kMachine =
    "--gpus-per-node 1 --gpu-mem 2G --host-ram 2G --ram-frac 1 --nvme-capacity 0 --micro-batch 2";

nlohmann::json plan_of(const std::string& preset) {
  return tier::test::plan_json("--model " + preset + " --seq " + std::to_string(kSeq) + " " + kMachine);
}

}  // namespace

TEST_CASE("every preset trains when --plan says it fits, and is refused by --plan otherwise",
          "[trainer][presets]") {
  const std::vector<std::string> presets = {"tiny", "small", "124M", "350M", "1.3B",
                                            "2.7B", "6.7B",  "13B",  "175B"};
  int ran = 0, refused = 0;
  for (const std::string& name : presets) {
    INFO("preset " << name);
    const nlohmann::json plan = plan_of(name);
    REQUIRE(!plan.is_discarded());
    REQUIRE(plan.is_object());
    REQUIRE(plan.contains("fits"));
    if (!plan["fits"].get<bool>()) {
      CHECK(!plan.value("why_not", std::string()).empty());
      ++refused;
      continue;
    }
    // The small presets take 6 steps at a high rate; a large one (124M: seconds per step on a
    // shared 2-core machine) 2 steps at GPT-2's rate, so the second step's loss shows the
    // first update's effect.
    const bool large = plan["params"].get<double>() > 1e7;
    const int steps = large ? 2 : 6;
    const auto r = run_trainer(1, "--model " + name + " --seq " + std::to_string(kSeq) +
                                      " --batch 2 --steps " + std::to_string(steps) +
                                      (large ? " --lr 3e-4" : " --lr 1e-2") + " --seed 2 --val-every -1");
    INFO(r.stderr_text);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.losses.size() == static_cast<size_t>(steps));
    CHECK(r.losses.back() < r.losses.front() - 0.3);
    ++ran;
  }
  // tiny, small and 124M fit 2 GiB (124M: 1.3 GiB of state); 350M and up do not.
  CHECK(ran == 3);
  CHECK(refused == 6);
}
