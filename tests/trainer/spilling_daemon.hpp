// The daemon of the trainer tests whose state must live mostly on NVMe: a tierd with a 64 MiB
// RAM tier over NVMe in a temporary directory (removed however the test ends; the daemon
// removes its arenas on exit), and the tier-train options that put a job's state there.
#pragma once

#include <string>

#include "nvme/test_util.hpp"
#include "support/daemon_fixture.hpp"

namespace tier::test {

inline DaemonOptions spilling_daemon_options(const std::string& nvme_dir) {
  DaemonOptions o;
  o.ram = "64M";
  o.extra_args = {"--remove-arenas-on-exit", "--nvme-dir", nvme_dir};
  return o;
}

struct SpillingDaemon {
  tier::nvme::testing::TempDir dir;  // declared first: outlives the daemon
  TestDaemon daemon{spilling_daemon_options(dir.path())};

  bool running() const { return !dir.path().empty() && daemon.running(); }
  // --state tier in this daemon under a 14 MiB RAM quota: the 4-block width-128 model's state
  // (0.83 M params, 23-25 MB double-buffered) spills and is fetched back every step.
  std::string tier_args() const {
    return " --state tier --ram-quota 14M --nvme-quota 256M --socket " + daemon.socket();
  }
};

}  // namespace tier::test
