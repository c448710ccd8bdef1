// Session: what tierd knows of one client connection, from its credentials (SO_PEERCRED,
// SO_PEERGROUPS) and its Hello to the leases it holds. Owned by the server's connection; the
// request handler and the lease service hold pointers to it while it is registered.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "leases/lease_table.hpp"

namespace tier::daemon {

struct Session {
  uint64_t id = 0;
  uid_t uid = 0;  // from SO_PEERCRED
  gid_t gid = 0;
  pid_t pid = 0;
  uint64_t pid_start = 0;  // the process's start time, read at Hello (daemon/leases/reclaim.hpp)
  bool hello = false;
  int32_t numa_node = -1;  // the client's node from Hello
  std::string name;        // the client's name from Hello
  SessionLeases leases;
  std::vector<gid_t> groups;  // supplementary groups from SO_PEERGROUPS (daemon/leases/access.hpp)
  uint32_t waiting = 0;       // lease requests of this session waiting now
  bool counted = false;       // counted in the per-uid connection table (after Hello)
};

}  // namespace tier::daemon
