// tools/bench-train-nvme end to end on this build's binaries, with a model small enough for CI:
// it must print one figure per step and a summary whose ratio is the step time over the bound
// it computed from the figures it printed, and leave nothing behind.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_binary.hpp"

TEST_CASE("tools/bench-train-nvme measures the NVMe-state step against its bound in one run") {
  const std::string build = std::filesystem::path(TIER_BIN_DIR).parent_path().string();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "bench-train-nvme-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto r = tier::test::run_binary(std::string(TIER_SOURCE_DIR) + "/tools/bench-train-nvme",
                                  {"--build", build, "--dir", dir.string(), "--ram", "4M", "--steps", "4",
                                   "--model", "--layers 2 --dim 64 --heads 2 --seq 16 --batch 2 --buffers 2"},
                                  {"LSAN_OPTIONS=detect_leaks=0"}, 300);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::vector<nlohmann::json> steps;
  nlohmann::json summary;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE(!j.is_discarded());
    if (j["name"] == "train.nvme.step") steps.push_back(j);
    else if (j["name"] == "train.nvme.ratio_median") summary = j;
  }
  REQUIRE(steps.size() == 4);
  for (const auto& s : steps) {
    const double bound = s["baseline"].get<double>();
    CHECK(bound == Approx(std::max(s["compute_ms"].get<double>(), s["io_ms"].get<double>())).epsilon(1e-3));
    CHECK(s["ratio"].get<double>() == Approx(s["value"].get<double>() / bound).epsilon(1e-3));
  }
  // 4 MiB of RAM under about 3 MiB of state: the run really went through NVMe.
  double written = 0;
  for (const auto& s : steps) written += s["written_mib"].get<double>();
  CHECK(written > 0);
  REQUIRE(summary.is_object());
  CHECK(summary["steps"] == 2);  // steps 2 and 3 of 4
  const double lo = std::min(steps[1]["ratio"].get<double>(), steps[2]["ratio"].get<double>());
  const double hi = std::max(steps[1]["ratio"].get<double>(), steps[2]["ratio"].get<double>());
  CHECK(summary["value"].get<double>() == Approx((lo + hi) / 2).epsilon(1e-3));
  CHECK(summary["raw_write_gbps"].get<double>() > 0);
  CHECK(summary["raw_read_gbps"].get<double>() > 0);
  // Its tierd's files and the raw benchmark's are gone.
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST_CASE("tools/bench-train-nvme refuses bad options with a clear message") {
  auto r = tier::test::run_binary(std::string(TIER_SOURCE_DIR) + "/tools/bench-train-nvme", {"--steps", "2"},
                                  {}, 30);
  CHECK(r.rc == 2);
  CHECK(r.err.find("--steps") != std::string::npos);
  auto b = tier::test::run_binary(std::string(TIER_SOURCE_DIR) + "/tools/bench-train-nvme",
                                  {"--build", "/nonexistent"}, {}, 30);
  CHECK(b.rc == 2);
  CHECK(b.err.find("build directory") != std::string::npos);
  auto h =
      tier::test::run_binary(std::string(TIER_SOURCE_DIR) + "/tools/bench-train-nvme", {"--help"}, {}, 30);
  CHECK(h.rc == 0);
  CHECK(h.out.find("Usage: tools/bench-train-nvme") != std::string::npos);
}
