// The daemon's one clock: deadlines, lease waits, LRU stamps and timers all read it.
#pragma once

#include <chrono>

namespace tier::daemon {

using Clock = std::chrono::steady_clock;

}  // namespace tier::daemon
