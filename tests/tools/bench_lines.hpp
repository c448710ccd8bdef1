// tier-bench's output contract, shared by the tests of its suites: one JSON object per line
// with name, value, unit, baseline, ratio (and bytes where a size applies).
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

namespace tier::test {

// Every non-empty line of `out` as JSON; a line that is not JSON throws, failing the test.
inline std::vector<nlohmann::json> parse_bench_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    v.push_back(nlohmann::json::parse(line));
  }
  return v;
}

// The common keys; "bytes" present (an unsigned number) exactly when the figure is `sized`.
inline void check_bench_keys(const nlohmann::json& j, bool sized) {
  INFO(j.dump());
  REQUIRE(j.is_object());
  CHECK(j["name"].is_string());
  CHECK(j["value"].is_number());
  CHECK(j["unit"].is_string());
  CHECK(j["baseline"].is_number());
  CHECK(j["ratio"].is_number());
  CHECK(j.contains("bytes") == sized);
  if (sized) CHECK(j["bytes"].is_number_unsigned());
}

}  // namespace tier::test
