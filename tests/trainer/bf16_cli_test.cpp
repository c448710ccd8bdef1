// --precision on tier-train's command line: what a bf16 run refuses (exit status 2, naming the
// option), its default per backend, the value check, and that bf16 does change the arithmetic.
// One process, no daemon.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "run_helper.hpp"

using tier::test::run_trainer;
using tier::test::TrainRun;

namespace {

const std::string kTiny = "--model tiny --steps 3 --batch 4 --val-every -1";

void expect_refused(const TrainRun& r, const std::string& option) {
  INFO(r.stderr_text);
  CHECK(r.exit_code == 2);
  CHECK(r.losses.empty());
  CHECK(r.stderr_text.find("--precision bf16 is not supported with " + option) != std::string::npos);
}

}  // namespace

TEST_CASE("tier-train --precision bf16 refuses the tools that read fp32 state, by name",
          "[trainer][cli][bf16]") {
  const std::string bf16 = kTiny + " --precision bf16";
  expect_refused(run_trainer(1, bf16 + " --state tier --resume --reshard"), "--reshard");
  expect_refused(run_trainer(1, bf16 + " --dump /tmp"), "--dump");
}

TEST_CASE("tier-train --precision bf16 is not refused with the GPU paths", "[trainer][cli][bf16]") {
  // Without a GPU these runs stop at the device (exit 2 saying why), not at the precision.
  for (const std::string gpu :
       {" --backend cuda", " --backend cuda --collectives nccl --optimizer gpu", " --optimizer gpu"}) {
    std::string args = kTiny + " --precision bf16";
    args += gpu;
    const TrainRun r = run_trainer(1, args);
    INFO(gpu << ": " << r.stderr_text);
    CHECK(r.stderr_text.find("is not supported with") == std::string::npos);
    if (r.exit_code != 0) CHECK(r.stderr_text.find("cuda") != std::string::npos);
  }
}

TEST_CASE("tier-train's default precision is bf16 with --backend cuda and fp32 otherwise",
          "[trainer][cli][bf16]") {
  const std::string plan = "--model small --gpus-per-node 1";
  CHECK(tier::test::plan_json(plan)["precision"] == "fp32");
  CHECK(tier::test::plan_json(plan + " --backend cpu")["precision"] == "fp32");
  CHECK(tier::test::plan_json(plan + " --backend cuda")["precision"] == "bf16");
  CHECK(tier::test::plan_json(plan + " --backend cuda --precision fp32")["precision"] == "fp32");
  CHECK(tier::test::plan_json(plan + " --precision bf16")["precision"] == "bf16");
}

TEST_CASE("tier-train --plan with --backend cuda plans the device pipeline's bf16 parameter slots",
          "[trainer][cli][bf16][plan]") {
  const std::string plan = "--model small --gpus-per-node 1 --backend cuda";
  auto gathered = [](const std::string& args) {
    return tier::test::plan_json(args)["gpu_bytes_per_rank"]["gathered_layers"].get<double>();
  };
  // The pipeline computes from the gathered bf16 layers; the host path widens each into an
  // fp32 slot beside its bf16 staging.
  const double pipeline = gathered(plan), host = gathered(plan + " --collectives host");
  CHECK(pipeline > 0);
  CHECK(pipeline < host);
  CHECK(gathered(plan + " --collectives auto") == pipeline);
  CHECK(gathered(plan + " --precision fp32") > pipeline);
}

TEST_CASE("tier-train --precision takes fp32 or bf16", "[trainer][cli][bf16]") {
  const TrainRun bad = run_trainer(1, kTiny + " --precision fp16");
  CHECK(bad.exit_code != 0);
  CHECK(bad.losses.empty());
  const TrainRun fp32 = run_trainer(1, kTiny + " --precision fp32");
  const TrainRun dflt = run_trainer(1, kTiny);
  const TrainRun bf16 = run_trainer(1, kTiny + " --precision bf16");
  INFO(bf16.stderr_text);
  REQUIRE(fp32.exit_code == 0);
  REQUIRE(bf16.exit_code == 0);
  REQUIRE(bf16.losses.size() == 3);
  CHECK(dflt.losses == fp32.losses);  // fp32 is the default
  // Step 1 computes with bf16-rounded initial weights: its loss differs from fp32's.
  CHECK(bf16.losses[0] != fp32.losses[0]);
}
