// tools/bench-blas-kernels end to end on this build's tier-train, with a model small enough for
// CI: one figure per run naming the kernels it used (the baseline runs OpenBLAS's generic
// fallback), and a summary whose ratio is the picked kernels' median step over the fallback's.
#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_binary.hpp"

namespace {
const std::string kTool = std::string(TIER_SOURCE_DIR) + "/tools/bench-blas-kernels";
}

TEST_CASE("tools/bench-blas-kernels times the kernels tier-train picks against OpenBLAS's fallback") {
  const std::string build = std::filesystem::path(TIER_BIN_DIR).parent_path().string();
  auto r = tier::test::run_binary(kTool,
                                  {"--build", build, "--steps", "3", "--rounds", "2", "--model",
                                   "--layers 2 --dim 64 --heads 2 --seq 16 --batch 2"},
                                  {"LSAN_OPTIONS=detect_leaks=0"}, 300);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::vector<nlohmann::json> runs;
  nlohmann::json summary;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE(!j.is_discarded());
    if (j["name"] == "train.blas.run") runs.push_back(j);
    else if (j["name"] == "train.blas.step") summary = j;
  }
  REQUIRE(runs.size() == 4);  // 2 rounds x (fallback, picked)
  REQUIRE(summary.is_object());
#if defined(__x86_64__)
  CHECK(summary["baseline_kernels"] == "Prescott");
  CHECK(runs[0]["kernels"] == "Prescott");
#endif
  CHECK(summary["kernels"].get<std::string>() != "unknown");
  CHECK(summary["kernels"] == runs[1]["kernels"]);
  // The summary is the median of the rounds (two: their mean), and its ratio their quotient.
  const double picked = (runs[1]["value"].get<double>() + runs[3]["value"].get<double>()) / 2;
  const double generic = (runs[0]["value"].get<double>() + runs[2]["value"].get<double>()) / 2;
  CHECK(summary["value"].get<double>() == Approx(picked).epsilon(1e-3));
  CHECK(summary["baseline"].get<double>() == Approx(generic).epsilon(1e-3));
  CHECK(summary["ratio"].get<double>() == Approx(picked / generic).epsilon(1e-3));
}

TEST_CASE("tools/bench-blas-kernels refuses bad options with a clear message") {
  auto s = tier::test::run_binary(kTool, {"--steps", "1"}, {}, 30);
  CHECK(s.rc == 2);
  CHECK(s.err.find("--steps") != std::string::npos);
  auto b = tier::test::run_binary(kTool, {"--build", "/nonexistent"}, {}, 30);
  CHECK(b.rc == 2);
  CHECK(b.err.find("build first") != std::string::npos);
  auto h = tier::test::run_binary(kTool, {"--help"}, {}, 30);
  CHECK(h.rc == 0);
  CHECK(h.out.find("Usage: tools/bench-blas-kernels") != std::string::npos);
}
