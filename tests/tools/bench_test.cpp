// tier-bench's output contract: JSON lines with name, value, unit, baseline, ratio (and bytes
// where a size applies). The figures themselves are never asserted: this machine's timing is
// not the test's business.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <sstream>

#include "bench_lines.hpp"
#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"

using nlohmann::json;
using tier::test::bin_path;
using tier::test::check_bench_keys;
using tier::test::parse_bench_lines;
using tier::test::run_binary;

TEST_CASE("tier-bench ram --quick --json prints the documented JSON lines") {
  auto r = run_binary(bin_path("tier-bench"), {"ram", "--quick", "--json"}, {}, 120);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto lines = parse_bench_lines(r.out);
  std::set<std::string> names;
  for (const auto& j : lines) {
    check_bench_keys(j, true);
    CHECK(j["unit"] == "GB/s");
    names.insert(j["name"]);
  }
  CHECK(lines.size() == 8);  // 4 figures x 2 sizes
  CHECK(names == std::set<std::string>{"ram.read.held", "ram.write.held", "ram.read.lease_cycle",
                                       "ram.write.lease_cycle"});
}

TEST_CASE("tier-bench rpc --quick --json prints the documented JSON lines") {
  auto r = run_binary(bin_path("tier-bench"), {"rpc", "--quick", "--json"}, {}, 120);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::set<std::string> names;
  for (const auto& j : parse_bench_lines(r.out)) {
    check_bench_keys(j, false);
    names.insert(j["name"]);
    std::string n = j["name"];
    CHECK(j["unit"] == (n.rfind("rpc.lease_batch", 0) == 0 ? "leases/s" : "us"));
  }
  CHECK(names.count("rpc.lease") == 1);
  CHECK(names.count("rpc.lease_release") == 1);
  CHECK(names.count("rpc.lease_batch") == 1);
}

TEST_CASE("tier-bench rpc works against a running tierd given by --socket") {
  tier::test::TestDaemon d;
  auto r = run_binary(bin_path("tier-bench"), {"rpc", "--quick", "--json", "--socket", d.socket()}, {}, 120);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto lines = parse_bench_lines(r.out);
  REQUIRE(lines.size() == 3);  // no placement variants against a daemon it does not own
  for (const auto& j : lines) check_bench_keys(j, false);
}

TEST_CASE("tier-bench usage errors exit 2") {
  CHECK(run_binary(bin_path("tier-bench"), {}).rc == 2);
  CHECK(run_binary(bin_path("tier-bench"), {"bogus"}).rc == 2);
  auto help = run_binary(bin_path("tier-bench"), {"--help"});
  CHECK(help.rc == 0);
  CHECK(help.out.find("ratio") != std::string::npos);
}

TEST_CASE("tier-bench load --clients 8 --seconds 2 prints its figures with zero errors") {
  auto r =
      run_binary(bin_path("tier-bench"), {"load", "--clients", "8", "--seconds", "2", "--json"}, {}, 120);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::map<std::string, json> by_name;
  for (const auto& j : parse_bench_lines(r.out)) {
    check_bench_keys(j, false);
    by_name[j["name"]] = j;
  }
  for (const char* n :
       {"load.ops", "load.lease.p50", "load.lease.p99", "load.lease.p999", "load.errors", "load.daemon_rss"})
    CHECK(by_name.count(n) == 1);
  REQUIRE(by_name.count("load.errors") == 1);
  CHECK(by_name["load.errors"]["value"] == 0);
  CHECK(by_name["load.ops"]["value"].get<double>() > 0);
  CHECK(by_name["load.ops"]["unit"] == "ops/s");
  CHECK(by_name["load.lease.p50"]["value"].get<double>() <=
        by_name["load.lease.p999"]["value"].get<double>());
  // RSS before and after were both read from /proc (the private daemon's pid is known).
  CHECK(by_name["load.daemon_rss"]["value"].get<double>() > 0);
  CHECK(by_name["load.daemon_rss"]["baseline"].get<double>() > 0);
}
