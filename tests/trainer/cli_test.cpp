// tier-train's --collectives flag: its validation (clear message, exit status 2) and the host
// path it selects for the CPU backend. Runs on any machine; the NCCL path itself is covered by
// tests/gpu/train_pipeline_test.cpp on a GPU.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "run_helper.hpp"
#include "support/daemon_fixture.hpp"

using tier::test::run_trainer;
using tier::test::TrainRun;

namespace {

const std::string kTiny = "--model tiny --steps 2 --batch 4 --val-every -1";

void expect_refused(const TrainRun& r, const std::string& says) {
  INFO(r.stderr_text);
  CHECK(r.exit_code == 2);
  CHECK(r.losses.empty());
  CHECK(r.stderr_text.find(says) != std::string::npos);
}

}  // namespace

TEST_CASE("tier-train refuses --collectives nccl with the CPU backend", "[trainer][cli]") {
  expect_refused(run_trainer(1, kTiny + " --collectives nccl"),
                 "--collectives nccl needs --backend cuda");
  expect_refused(run_trainer(1, kTiny + " --backend cpu --collectives nccl"),
                 "--collectives nccl needs --backend cuda");
}

TEST_CASE("tier-train refuses an unknown --collectives value", "[trainer][cli]") {
  expect_refused(run_trainer(1, kTiny + " --collectives mpi"),
                 "--collectives must be auto, nccl or host, not 'mpi'");
}

TEST_CASE("tier-train refuses --collectives nccl in a build without NCCL", "[trainer][cli]") {
#if defined(TIER_TEST_TRAINER_HAS_NCCL)
  // This build has NCCL: the flag passes validation and needs a GPU (tests/gpu covers it).
  SUCCEED("built with NCCL");
#else
  expect_refused(run_trainer(1, kTiny + " --backend cuda --collectives nccl"),
                 "--collectives nccl: this build has no NCCL");
#endif
}

TEST_CASE("the CPU backend trains on the host path with --collectives auto and host", "[trainer][cli]") {
  for (const char* c : {"", " --collectives auto", " --collectives host"}) {
    const TrainRun r = run_trainer(1, kTiny + c);
    INFO(c << ": " << r.stderr_text);
    CHECK(r.exit_code == 0);
    CHECK(r.losses.size() == 2);
    CHECK(r.stderr_text.find("collectives host (MPI)") != std::string::npos);
  }
}

TEST_CASE("tier-train --help documents --collectives", "[trainer][cli]") {
  std::FILE* p = popen((tier::test::bin_path("tier-train") + " --help").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) text += buf;
  CHECK(pclose(p) == 0);
  CHECK(text.find("--collectives") != std::string::npos);
  CHECK(text.find("nccl") != std::string::npos);
}
