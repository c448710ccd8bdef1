// tools/demo end to end, on this build's binaries (TIER_BUILD_DIR), so it never rebuilds.
#include <catch2/catch.hpp>
#include <filesystem>

#include "run_binary.hpp"

TEST_CASE("tools/demo runs end to end and stops its tierd") {
  std::string build = std::filesystem::path(TIER_BIN_DIR).parent_path().string();
  // A short run: the test checks the demo's plumbing (start, train, status, stop), not how far
  // the loss falls, and must not depend on how fast the machine is.
  auto r = tier::test::run_binary(std::string(TIER_SOURCE_DIR) + "/tools/demo", {},
                                  {"TIER_BUILD_DIR=" + build, "TIER_DEMO_STEPS=40",
                                   // As in the trainer tests (tests/trainer/run_helper.hpp):
                                   // Open MPI's plugins leak at exit under ASan.
                                   "LSAN_OPTIONS=detect_leaks=0"},
                                  300);
  INFO(r.out);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("round trip: identical") != std::string::npos);
  CHECK(r.out.find("tierd stopped cleanly") != std::string::npos);
  CHECK(r.out.find("NUMA nodes") != std::string::npos);
  CHECK(r.out.find("for 40 steps") != std::string::npos);
  // The status after training: a daemon without an NVMe tier answered no request with an error
  // (the trainer stops its prefetch hints after the first kUnsupported).
  const size_t at = r.out.rfind("\n  errors ");
  REQUIRE(at != std::string::npos);
  const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  INFO(line);
  CHECK(line.find_last_not_of(' ') == line.find_last_of('0'));
  CHECK(line.substr(line.find_last_of(' ') + 1) == "0");
}
