// tier-bench nvme --quick: runs end to end on a disk directory and prints well-formed figures.
// Checks shape and arithmetic only, never speed.
#include <catch2/catch.hpp>
#include <stdio.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.hpp"

// Whether tier-bench was built (it is optional); says so when it was not.
static bool built(const std::string& bench) {
  if (std::filesystem::exists(bench)) return true;
  WARN("skipped: " << bench << " is not built");
  return false;
}

TEST_CASE("tier-bench nvme --quick prints spill, fetch and daemon plan figures with their baselines") {
  const std::string bench = std::string(TIER_BIN_DIR) + "/tier-bench";
  if (!built(bench)) return;
  tier::nvme::testing::TempDir dir;
  std::string cmd = bench + " nvme --quick --json --dir " + dir.path() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::map<std::string, int> seen;
  std::map<std::string, nlohmann::json> last;
  char line[4096];
  std::string other;
  while (fgets(line, sizeof line, p)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      other += line;
      continue;
    }
    std::string name = j.at("name");
    ++seen[name];
    last[name] = j;
    double v = j.at("value"), b = j.at("baseline"), r = j.at("ratio");
    CHECK(std::isfinite(v));
    CHECK(b > 0);
    if (b > 0) CHECK(r == Approx(v / b));
    if (name == "nvme.spill" || name == "nvme.fetch") {
      CHECK(j.at("unit") == "GB/s");
      CHECK(v > 0);
      // The raw ceiling names the candidate that won (tier-bench's own loop or fio).
      CHECK(!j.value("baseline_name", std::string()).empty());
    }
  }
  int status = ::pclose(p);
  INFO("non-JSON output: " << other);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(seen["nvme.spill"] == 2);  // 1 and 16 MiB
  CHECK(seen["nvme.fetch"] == 2);
  CHECK(seen["nvme.spill.first"] == 2);  // a fresh tier's first write, once per size
  CHECK(seen["nvme.prepare"] == 1);      // its start-up preparation (one data file)
  CHECK(seen["nvme.spill_syncs"] == 2);  // spills are synced: at least one flush, at most one each
  // 1 MiB requests: one per 1 MiB tensor, 16 per 16 MiB one (the last size printed).
  CHECK(seen["nvme.spill_requests"] == 2);
  if (last.contains("nvme.spill_requests")) {
    CHECK(last["nvme.spill_requests"].at("baseline") == 16.0);
    CHECK(last["nvme.spill_requests"].at("value") >= 16.0);
    CHECK(last["nvme.spill_requests"].at("value") < 16.5);
  }
  // One thread's checksum rate over 8 MiB extents against reading the same bytes.
  CHECK(seen["nvme.hash"] == 1);
  if (last.contains("nvme.hash")) {
    CHECK(last["nvme.hash"].at("bytes") == 8u << 20);
    CHECK(last["nvme.hash"].at("unit") == "GB/s");
    CHECK(last["nvme.hash"].at("value") > 0.0);
    CHECK(last["nvme.hash"].at("baseline_name") == "read");
  }
  if (last.contains("nvme.spill_syncs")) {
    CHECK(last["nvme.spill_syncs"].at("value") > 0.0);
    CHECK(last["nvme.spill_syncs"].at("value") <= 1.0);
  }
  // A cyclic plan over twice the RAM tier through a private tierd with an NVMe directory: plain
  // LRU misses on (nearly) every use; with the plan registered tierd prefetches ahead.
  for (const char* n : {"nvme.daemon_plan.misses", "nvme.daemon_plan.stall", "nvme.daemon_plan.moved",
                        "nvme.daemon_plan.step", "nvme.daemon_plan.lru_step"})
    CHECK(seen[n] == 1);
  if (last.contains("nvme.daemon_plan.moved")) CHECK(last["nvme.daemon_plan.moved"].at("value") > 0.0);
  if (last.contains("nvme.daemon_plan.misses")) {
    CHECK(last["nvme.daemon_plan.misses"].at("baseline") >= 24.0);  // LRU: (nearly) every use
    CHECK(last["nvme.daemon_plan.misses"].at("value") < last["nvme.daemon_plan.misses"].at("baseline"));
  }
  // The bench cleans up after itself.
  CHECK(std::filesystem::is_empty(dir.path()));
}

// --no-ceiling (what tools/bench-deepnvme's tierd side runs): the engine's figures only, with no
// raw ceiling loops between its samples, so baseline and ratio are 0 and no candidate is named.
TEST_CASE("tier-bench nvme --no-ceiling measures the engine alone; it needs --only-bandwidth") {
  const std::string bench = std::string(TIER_BIN_DIR) + "/tier-bench";
  if (!built(bench)) return;
  tier::nvme::testing::TempDir dir;
  CHECK(WEXITSTATUS(
            ::system((bench + " nvme --no-ceiling --dir " + dir.path() + " >/dev/null 2>&1").c_str())) == 2);
  // The engine's request size and queue depth are refused outside what it can run.
  for (const char* bad :
       {"--request-size 3000", "--request-size 0", "--request-size 128M", "--queue-depth 0"})
    CHECK(WEXITSTATUS(
              ::system((bench + " nvme --only-bandwidth " + bad + " --dir " + dir.path() + " >/dev/null 2>&1")
                           .c_str())) == 2);
  std::string cmd = bench +
                    " nvme --json --only-bandwidth --no-ceiling --no-fresh --samples 1 --sizes 1M,4M" +
                    " --flush-behind 1M --queue-depth 8 --request-size 4M --dir " + dir.path() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::map<std::string, int> seen;
  char line[4096];
  while (fgets(line, sizeof line, p)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    REQUIRE((j.is_object() && j.contains("name")));
    std::string name = j.at("name");
    ++seen[name];
    if (name == "nvme.spill" || name == "nvme.fetch") {
      CHECK(double(j.at("value")) > 0);
      CHECK(double(j.at("baseline")) == 0);
      CHECK(double(j.at("ratio")) == 0);
      CHECK_FALSE(j.contains("baseline_name"));
    }
    if (name == "nvme.spill_requests") {  // --request-size 4M: one request per 1 or 4 MiB tensor
      CHECK(double(j.at("baseline")) == 1.0);
      CHECK(double(j.at("value")) >= 1.0);
      CHECK(double(j.at("value")) < 1.1);
    }
  }
  int status = ::pclose(p);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(seen["nvme.spill"] == 2);
  CHECK(seen["nvme.fetch"] == 2);
  CHECK(seen["nvme.spill_requests"] == 2);
  CHECK(seen.size() == 4);  // and nvme.spill_syncs: no fresh tier, no daemon plan
  CHECK(std::filesystem::is_empty(dir.path()));
}
