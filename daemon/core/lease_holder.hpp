// Who holds a write lease, as the journal records it (Durability) and a reclaim after a restart
// checks it (ReclaimTable).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace tier::daemon {

// Who holds a write lease, as tierd saw it (the fields of journal::WriteLeaseHeld).
struct LeaseHolder {
  uid_t uid = 0;
  pid_t pid = 0;           // SO_PEERCRED, in tierd's pid namespace; 0: not visible there
  uint64_t pid_start = 0;  // the process's start time (/proc/<pid>/stat field 22); 0: unknown
  uint64_t pid_ns = 0;     // inode of tierd's pid namespace when the lease was granted
};

}  // namespace tier::daemon
