// Snapshot manifests: the durable description of one pool snapshot.
//
// A manifest uses the journal's file format (format.hpp) with the magic kManifestMagic:
//   ManifestBegin {pool_id, snapshot_id, created_unix_ms}
//   PoolCreated   (the pool as it was)
//   per tensor: TensorCreated, then NvmeCopyWritten naming the snapshot's data extents and
//               their checksums
//   ManifestEnd   {records between Begin and End, sum of the tensors' sizes}
// It is written whole to a temp file, fsynced, renamed into place and the directory fsynced, so
// a manifest on disk is either complete or absent: unlike the journal, a manifest with a torn
// tail, a missing End or counts that disagree is refused (kCorruption), never truncated.
// Which files hold the data and how they are copied is the snapshot writer's business; the
// manifest only records it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "journal/records.hpp"
#include "tier/status.hpp"

namespace tier::journal {

struct Manifest {
  ManifestBegin begin;
  std::vector<Record> body;  // between Begin and End
  ManifestEnd end;
};

// Writes `path` atomically (path + ".tmp", fsync, rename, fsync of the directory). `body` must
// not contain ManifestBegin/End (kInvalidArgument); End is computed from it.
[[nodiscard]] Status write_manifest(const std::string& path, const ManifestBegin& begin,
                                    std::span<const Record> body);

// Reads and validates the manifest at `path`.
[[nodiscard]] Result<Manifest> read_manifest(const std::string& path);

// Validates a manifest image in memory (what read_manifest does after reading the file).
[[nodiscard]] Result<Manifest> parse_manifest(std::span<const std::byte> image);

}  // namespace tier::journal
