// tier-bench catalog, small: the suite runs end to end against a real tierd, prints every
// documented JSON line with zero errors, and (--keep) leaves a catalog that tierd recovers whole
// after a restart. Figures are never asserted: this machine's timing is not the test's business.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <map>
#include <sstream>
#include <string>

#include "bench_lines.hpp"
#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

using nlohmann::json;
using tier::test::bin_path;
using tier::test::run_binary;

namespace {

// Every stdout line must be one JSON object with the common keys and no "bytes"; keyed by name.
std::map<std::string, json> figures(const std::string& out) {
  std::map<std::string, json> by_name;
  for (const json& j : tier::test::parse_bench_lines(out)) {
    tier::test::check_bench_keys(j, false);
    CHECK(by_name.count(j["name"]) == 0);
    by_name[j["name"]] = j;
  }
  return by_name;
}

void check_common(std::map<std::string, json>& f) {
  for (const char* n : {"catalog.create", "catalog.create.tail", "catalog.lease.p50", "catalog.lease.p99",
                        "catalog.open.p50", "catalog.open.p99", "catalog.list", "catalog.daemon_rss",
                        "catalog.bytes_per_tensor", "catalog.errors"}) {
    INFO(n);
    REQUIRE(f.count(n) == 1);
  }
  CHECK(f["catalog.errors"]["value"] == 0);
  for (const char* n : {"catalog.create", "catalog.create.tail", "catalog.list"}) {
    INFO(n);
    CHECK(f[n]["unit"] == "tensors/s");
    CHECK(f[n]["value"].get<double>() > 0);
    CHECK(f[n]["baseline"].get<double>() > 0);
  }
  for (const char* n : {"catalog.lease.p50", "catalog.open.p50"}) {
    INFO(n);
    CHECK(f[n]["unit"] == "us");
    CHECK(f[n]["value"].get<double>() > 0);
    CHECK(f[n]["baseline"].get<double>() > 0);
  }
  CHECK(f["catalog.lease.p50"]["value"].get<double>() <= f["catalog.lease.p99"]["value"].get<double>());
  CHECK(f["catalog.open.p50"]["value"].get<double>() <= f["catalog.open.p99"]["value"].get<double>());
  // tierd's RSS was read before and after (its pid comes from SO_PEERCRED).
  CHECK(f["catalog.daemon_rss"]["value"].get<double>() > 0);
  CHECK(f["catalog.daemon_rss"]["baseline"].get<double>() > 0);
}

}  // namespace

TEST_CASE("tier-bench catalog --keep against a running tierd leaves a catalog it recovers") {
  tier::test::DaemonOptions opts;
  opts.ram = "512M";  // the three pools' 31 000 extents of 4 KiB (121 MiB) and their arenas
  tier::test::TestDaemon d(opts);
  auto r = run_binary(bin_path("tier-bench"),
                      {"catalog", "--tensors", "20000", "--clients", "16", "--quick", "--json", "--socket",
                       d.socket(), "--keep"},
                      {}, 300);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto f = figures(r.out);
  check_common(f);
  CHECK(f.count("catalog.drop") == 0);  // --keep: nothing dropped, nothing timed

  // The pools stayed: 20000 + the 10000 of the create baseline + the 1000 of the lookup baseline.
  REQUIRE(d.stop() == 0);
  d.start();
  std::string log = d.log();
  INFO(log);
  CHECK(log.find("recovered 3 pools, 31000 tensors") != std::string::npos);
  auto c = tier::Client::connect(d.socket());
  REQUIRE(c);
  auto pools = (*c)->list_pools();
  REQUIRE(pools);
  std::map<std::string, uint64_t> count_by_suffix;
  for (const auto& p : *pools) count_by_suffix[p.name.substr(p.name.rfind('.'))] = p.tensor_count;
  CHECK(count_by_suffix ==
        std::map<std::string, uint64_t>{{".big", 20000}, {".base", 10000}, {".small", 1000}});
}

TEST_CASE("tier-bench catalog with a private tierd drops its pools and times the drop") {
  auto r = run_binary(bin_path("tier-bench"),
                      {"catalog", "--tensors", "3000", "--clients", "8", "--quick", "--json"}, {}, 300);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto f = figures(r.out);
  check_common(f);
  REQUIRE(f.count("catalog.drop") == 1);
  CHECK(f["catalog.drop"]["unit"] == "ms");
  CHECK(f["catalog.drop"]["value"].get<double>() > 0);
}

TEST_CASE("tier-bench catalog counts refused creates as errors and exits 1") {
  tier::test::DaemonOptions opts;
  opts.ram = "64M";  // room for ~16 000 extents of 4 KiB: the base rounds run out of RAM
  tier::test::TestDaemon d(opts);
  auto r = run_binary(
      bin_path("tier-bench"),
      {"catalog", "--tensors", "20000", "--clients", "8", "--quick", "--json", "--socket", d.socket()}, {},
      300);
  INFO(r.err);
  CHECK(r.rc == 1);
  auto f = figures(r.out);
  REQUIRE(f.count("catalog.errors") == 1);
  CHECK(f["catalog.errors"]["value"].get<double>() > 0);
  CHECK(r.err.find("RAM tier of NUMA node") != std::string::npos);
  // It cleaned up after itself: no pool of the suite is left in the daemon.
  auto c = tier::Client::connect(d.socket());
  REQUIRE(c);
  auto pools = (*c)->list_pools();
  REQUIRE(pools);
  CHECK(pools->empty());
}

TEST_CASE("tier-bench catalog --keep without --socket is refused") {
  auto r = run_binary(bin_path("tier-bench"), {"catalog", "--tensors", "10", "--keep", "--json"}, {}, 60);
  CHECK(r.rc == 1);
  CHECK(r.err.find("--keep needs --socket") != std::string::npos);
  CHECK(r.out.empty());
}
