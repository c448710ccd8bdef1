// Consistent cuts across nodes (--snapshot-every) and the rollback of a --resume after a node
// lost its RAM (docs/scaling.md, "A node reboots").
//
// The cut of step s: after every rank committed s (the markers say s), each daemon's pool is
// snapshotted, tagged s, while no rank of the job writes (the ranks wait in a collective until
// every node's snapshot is durable). Each daemon keeps its newest kCutsKept snapshots, so a
// job killed while node A's snapshot of s is durable and node B's is not still has s - N on
// both. A node that reboots loses its arenas: its tierd rebuilds the job's pool from the
// latest snapshot and the newer NVMe copies, a mix of two steps, and says so (recovered). The
// resume then restores every node's pool, rebooted or not, to the newest tag all of them hold;
// their markers (in the snapshots) then say that step and training continues from it.
#include <algorithm>
#include <cstdio>
#include <fmt/format.h>
#include <limits>
#include <vector>

#include "trainer/step.hpp"

namespace tier::train::detail {

namespace {

constexpr uint32_t kCutsKept = 2;
constexpr size_t kTagSlots = 4;  // newest tags per daemon compared (at most kCutsKept kept)
constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();  // a rank that writes no marker

// The newest tag every marker writer holds, from each rank's kTagSlots newest tags (0: empty
// slot; all kAny: the rank speaks for no daemon). 0 when there is none.
uint64_t newest_common_tag(const std::vector<std::vector<uint64_t>>& slots, int ranks) {
  uint64_t best = 0;
  for (int r = 0; r < ranks; ++r) {
    if (slots[0][r] == kAny) continue;
    for (size_t k = 0; k < kTagSlots; ++k) {
      const uint64_t t = slots[k][r];
      if (t == 0 || t <= best) continue;
      bool everywhere = true;
      for (int q = 0; q < ranks && everywhere; ++q) {
        if (slots[0][q] == kAny) continue;
        bool has = false;
        for (size_t j = 0; j < kTagSlots; ++j) has = has || slots[j][q] == t;
        everywhere = has;
      }
      if (everywhere) best = t;
    }
  }
  return best;
}

}  // namespace

Status Trainer::snapshot_cut(int64_t step) {
  // Every rank committed `step` and holds no pin: the pools hold exactly step's state.
  if (auto s = comm.barrier(); !s) return s;
  Status snap;
  if (marker_writer) snap = store.snapshot(static_cast<uint64_t>(step), kCutsKept);
  double bad = snap ? 0.0 : 1.0;
  if (auto s = comm.allreduce_max(&bad, 1); !s) return s;  // also: nobody writes before all are durable
  if (!snap)
    return Status(snap.code(),
                  fmt::format("--snapshot-every: the snapshot of step {}: {}", step, snap.message()));
  if (bad != 0.0)
    return Status(Code::kUnavailable,
                  fmt::format("--snapshot-every: another node's snapshot of step {} failed", step));
  fault_at("snapshot", step);
  return {};
}

Status Trainer::roll_back_if_recovered() {
  // Only marker writers ask their daemon; every rank takes part in the collectives.
  ShardStore::SnapshotState mine;
  Status err;
  bool supported = false;
  if (marker_writer) {
    auto st = store.snapshots();
    if (st) {
      mine = std::move(*st);
      supported = true;
    } else if (st.error().code() != Code::kUnsupported) {
      err = st.error();
    }
  }
  double v[2] = {supported && mine.recovered ? 1.0 : 0.0, err ? 0.0 : 1.0};  // any recovered, any error
  if (auto s = comm.allreduce_max(v, 2); !s) return s;
  if (!err) return Status(err.code(), "--resume: listing the job's snapshots: " + err.message());
  if (v[1] != 0.0)
    return Status(Code::kUnavailable, "--resume: another node could not list the job's snapshots");
  if (v[0] == 0.0) return {};  // no daemon lost the job's RAM: the markers decide

  // Some daemon rebuilt the pool from a snapshot and newer NVMe copies: roll every node back.
  std::vector<uint64_t> tags(kTagSlots, marker_writer ? 0 : kAny);
  if (marker_writer) {
    size_t k = 0;
    for (auto it = mine.snapshots.rbegin(); it != mine.snapshots.rend() && k < kTagSlots; ++it)
      if (it->second != 0) tags[k++] = it->second;
  }
  std::vector<std::vector<uint64_t>> slots;
  for (size_t k = 0; k < kTagSlots; ++k) {
    auto all = comm.allgather(tags[k]);
    if (!all) return all.error();
    slots.push_back(std::move(*all));
  }
  const uint64_t cut = newest_common_tag(slots, R);
  if (cut == 0)
    return Status(Code::kNotFound,
                  "--resume: a node's tierd lost this job's RAM (a reboot) and no snapshot step is held by "
                  "every node, so no step's state can be put back together; start the job again (and run "
                  "it with --snapshot-every N)");
  Status restored;
  if (marker_writer) {
    uint64_t id = 0;
    for (const auto& [sid, tag] : mine.snapshots)
      if (tag == cut) id = sid;  // the newest snapshot of that tag
    restored = store.restore(id);
  }
  double bad = restored ? 0.0 : 1.0;
  if (auto s = comm.allreduce_max(&bad, 1); !s) return s;
  if (!restored)
    return Status(restored.code(),
                  fmt::format("--resume: restoring the snapshot of step {}: {}", cut, restored.message()));
  if (bad != 0.0)
    return Status(Code::kUnavailable,
                  fmt::format("--resume: another node could not restore the snapshot of step {}", cut));
  if (rank == 0)
    std::fprintf(stderr,
                 "tier-train: --resume: a node's tierd lost this job's RAM (a reboot); every node's pool is "
                 "rolled back to the snapshot of step %lld\n",
                 static_cast<long long>(cut));
  return {};
}

}  // namespace tier::train::detail
