// The composition root: builds the daemon's parts from its config and wires them together
// (the RAM tier, the NVMe tier, then durability, which recovers the catalog). main.cpp, the
// tests and the fuzzers start a daemon through it; nothing below daemon/ includes it.
#pragma once

#include <memory>

#include "state/state.hpp"

namespace tier::daemon {

// Builds the state from a validated config and sizes: loads the topology and sets up the
// RAM tier. Errors name what failed.
[[nodiscard]] Result<std::unique_ptr<DaemonState>> make_state(Config cfg, ResolvedSizes sizes);

// Opens the journal in the state dir for `st` (daemon/durability.hpp): rebuilds its catalog
// and RAM tier, keeps the write leases held across a restart for their holders, makes what
// the rebuild journaled durable, and routes the NVMe tier's residency reports to it.
[[nodiscard]] Status open_durability(DaemonState& st, RecoveryReport* report = nullptr);

}  // namespace tier::daemon
