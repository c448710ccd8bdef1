// What operators read about a pool matches what tierd enforces: a pool created without an
// NVMe quota shows the daemon's default (nvme_pool_quota of the NVMe tier) in the pool list,
// in `tierctl --json pools` and in tierd_pool_nvme_quota_bytes, not the stored 0; and an NVMe
// directory the topology does not place has node="unknown" in the metrics, not node="-1".
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

using tier::test::bin_path;
using tier::test::run_binary;
using tier::test::TestDaemon;

TEST_CASE("a pool's effective NVMe quota is shown everywhere, and NVMe node labels are never -1") {
  char tmpl[] = "/tmp/tier-poolview.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string dir = tmpl, nvme = dir + "/nvme", cfg = dir + "/t.toml";
  std::filesystem::create_directories(nvme);
  std::ofstream(cfg) << "nvme_capacity = \"64M\"\nnvme_pool_quota = \"50%\"\nremove_arenas_on_exit = true\n";
  auto opts = tier::test::DaemonOptions::with_config(cfg);
  opts.extra_args.insert(opts.extra_args.end(), {"--nvme-dir", nvme});
  {
    TestDaemon d(opts);
    auto c = tier::Client::connect(d.socket());
    REQUIRE(c);
    constexpr uint64_t kDefault = 32ull << 20, kSet = 8ull << 20;
    auto made = (*c)->create_pool("dflt", {.ram_quota = 8 << 20});
    REQUIRE(made);
    CHECK(made->nvme_quota == kDefault);
    REQUIRE((*c)->create_pool("set", {.ram_quota = 8 << 20, .nvme_quota = kSet}));
    auto pools = (*c)->list_pools();
    REQUIRE(pools);
    for (const auto& p : *pools) CHECK(p.nvme_quota == (p.name == "dflt" ? kDefault : kSet));

    auto json = run_binary(bin_path("tierctl"), {"--socket", d.socket(), "--json", "pools"}, {}, 30);
    REQUIRE(json.rc == 0);
    CHECK(json.out.find("\"nvme_quota\": " + std::to_string(kDefault)) != std::string::npos);

    auto m = (*c)->metrics();
    REQUIRE(m);
    INFO(*m);
    CHECK(m->find("tierd_pool_nvme_quota_bytes{pool=\"dflt\",uid=\"0\"} " + std::to_string(kDefault) +
                  "\n") != std::string::npos);
    CHECK(m->find("tierd_pool_nvme_quota_bytes{pool=\"set\",uid=\"0\"} " + std::to_string(kSet) + "\n") !=
          std::string::npos);
    CHECK(m->find("tierd_nvme_capacity_bytes{tier=\"nvme\"") != std::string::npos);
    CHECK(m->find("node=\"-1\"") == std::string::npos);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}
