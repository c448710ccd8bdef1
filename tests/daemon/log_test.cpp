// The one logger (base/log.hpp): levels filter lines, a sink captures them unprefixed.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "base/log.hpp"

using namespace tier;

TEST_CASE("log: a sink gets kept lines at their level; lines above the level are dropped") {
  std::vector<std::pair<LogLevel, std::string>> got;
  set_log_sink([&](LogLevel l, std::string_view t) { got.emplace_back(l, std::string(t)); });
  set_log_level(LogLevel::kWarning);
  log_error("e {}", 1);
  log_warn("w {}", "two");
  log_info("dropped");
  log_debug("dropped too");
  set_log_level(LogLevel::kDebug);
  log_debug("d {}", 3.5);
  set_log_level(LogLevel::kInfo);
  set_log_sink({});
  REQUIRE(got.size() == 3);
  CHECK(got[0] == std::pair{LogLevel::kError, std::string("e 1")});
  CHECK(got[1] == std::pair{LogLevel::kWarning, std::string("w two")});
  CHECK(got[2] == std::pair{LogLevel::kDebug, std::string("d 3.5")});
}
