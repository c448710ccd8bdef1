// Reading a journal or manifest image: validation, torn-tail detection and record decoding.
//
// scan() works on bytes in memory so it can be fuzzed and tested without files; Journal::open
// and read_manifest() feed it a file's contents. It never reads outside `file`, never allocates
// more than a record's decoded size, and never throws.
//
// Recovery rules (docs/journal.md):
//   - 0 bytes: a new, empty file (`fresh`).
//   - 1..31 bytes that are a prefix of a valid header: a file whose creation was torn
//     (`fresh`, those bytes reported in dropped_bytes). Anything else short: kCorruption.
//   - A damaged file header: kCorruption. A newer format version: kUnsupported naming it.
//   - Records are checked in order. At the first record that fails its checks (short,
//     bad magic, bad length, bad checksum), the rest of the file is searched for any valid
//     record with a sequence number >= the expected one. If one exists, the damage is in the
//     middle: kCorruption naming the offset (nothing is dropped silently). If none does, the
//     damage is a torn tail: valid_end stops before it and dropped_bytes counts it.
//   - A record with a valid checksum but the wrong sequence number: kCorruption.
//   - A record type this build does not know: kUnsupported naming the type and version.
//   - A payload that fails to decode despite a valid checksum: kCorruption.
// The visitor is called only after the whole image passed the framing checks, in file order;
// if it returns an error, scanning stops with that error. On any error the caller must
// discard whatever the visitor built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "journal/format.hpp"
#include "journal/records.hpp"
#include "tier/status.hpp"

namespace tier::journal {

struct ScanResult {
  bool fresh = false;        // no complete header: the file is new (or its creation was torn)
  uint64_t first_seq = 1;    // from the header (1 when fresh)
  uint32_t base_kib = 0;     // from the header
  uint64_t last_seq = 0;     // of the last valid record; first_seq - 1 when there are none
  uint64_t records = 0;      // valid records
  size_t valid_end = 0;      // offset just past the last valid record (or the header)
  size_t dropped_bytes = 0;  // bytes after valid_end: a torn tail to truncate
};

// seq, and the record's offset in the file.
using RecordVisitor = std::function<Status(const Record& record, uint64_t seq, size_t offset)>;

// `magic`: kJournalMagic or kManifestMagic. `visit` may be empty (validation only).
[[nodiscard]] Result<ScanResult> scan(std::span<const std::byte> file, uint64_t magic,
                                      const RecordVisitor& visit);

// Encodes one record (header + payload) and appends it to `out`. kInvalidArgument when the
// payload exceeds kMaxPayloadBytes (out is left unchanged then).
[[nodiscard]] Status encode_record(const Record& record, uint64_t seq, std::vector<std::byte>& out);

// Appends a file header for a file whose first record will carry `first_seq`.
void encode_file_header(uint64_t magic, uint64_t first_seq, uint32_t base_kib, std::vector<std::byte>& out);

}  // namespace tier::journal
