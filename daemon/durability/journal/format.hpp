// The on-disk layout of tierd's catalog journal and snapshot manifests.
//
// A file is a FileHeader followed by records. A record is a RecordHeader followed by
// `payload_len` payload bytes (the record struct encoded with the wire codec, see records.hpp).
// There is no padding between records. Every constant and struct in this header is part of the
// on-disk format: changing one is a format change and bumps kFormatVersion. All integers are
// little-endian (wire/codec.hpp refuses to build on a big-endian host).
//
//   FileHeader   (32 bytes)
//     0  u64 magic        kJournalMagic "TIERJRNL" or kManifestMagic "TIERSNAP"
//     8  u16 version      kFormatVersion of the writer
//    10  u16 flags        0
//    12  u32 base_kib     journal: KiB of records a compaction wrote into this file (0 when
//                         it was created empty): the live-state estimate compaction uses
//    16  u64 first_seq    sequence number of the first record in this file
//    24  u64 checksum     XXH3-64 of bytes [0, 24)
//
//   RecordHeader (32 bytes)
//     0  u32 magic        kRecordMagic "TJRC"
//     4  u32 payload_len  <= kMaxPayloadBytes
//     8  u64 seq          previous record's seq + 1 (the first: FileHeader::first_seq)
//    16  u16 type         RecordType
//    18  u16 flags        0
//    20  u32 reserved     0
//    24  u64 checksum     XXH3-64 of the payload seeded with XXH3-64 of header bytes [0, 24)
//
// The checksum covers the header (so a record cannot be moved, renumbered or retyped
// unnoticed) and the payload (so a torn or flipped payload is caught).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tier::journal {

inline constexpr uint64_t kJournalMagic = 0x4C4E524A52454954ull;   // "TIERJRNL" as LE bytes
inline constexpr uint64_t kManifestMagic = 0x50414E5352454954ull;  // "TIERSNAP" as LE bytes
inline constexpr uint32_t kRecordMagic = 0x43524A54u;              // "TJRC" as LE bytes
inline constexpr uint16_t kFormatVersion = 1;

// A record payload larger than this is refused when writing and treated as damage when
// reading: a length field is the first thing a torn write garbles, and a bound keeps a
// garbage length from asking for gigabytes.
inline constexpr uint32_t kMaxPayloadBytes = 16u << 20;

struct FileHeader {
  uint64_t magic = kJournalMagic;
  uint16_t version = kFormatVersion;
  uint16_t flags = 0;
  uint32_t base_kib = 0;
  uint64_t first_seq = 1;
  uint64_t checksum = 0;
};
inline constexpr size_t kFileHeaderBytes = 32;
inline constexpr size_t kFileHeaderChecksummed = 24;
static_assert(sizeof(FileHeader) == kFileHeaderBytes, "FileHeader is an on-disk layout");
static_assert(offsetof(FileHeader, first_seq) == 16 && offsetof(FileHeader, checksum) == 24,
              "FileHeader is an on-disk layout");

struct RecordHeader {
  uint32_t magic = kRecordMagic;
  uint32_t payload_len = 0;
  uint64_t seq = 0;
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t reserved = 0;
  uint64_t checksum = 0;
};
inline constexpr size_t kRecordHeaderBytes = 32;
inline constexpr size_t kRecordHeaderChecksummed = 24;
static_assert(sizeof(RecordHeader) == kRecordHeaderBytes, "RecordHeader is an on-disk layout");
static_assert(offsetof(RecordHeader, seq) == 8 && offsetof(RecordHeader, type) == 16 &&
                  offsetof(RecordHeader, checksum) == 24,
              "RecordHeader is an on-disk layout");

// XXH3-64 of the first 24 bytes of `h`.
[[nodiscard]] uint64_t file_header_checksum(const FileHeader& h) noexcept;
// XXH3-64 of `payload`, seeded with XXH3-64 of the first 24 bytes of `h`.
[[nodiscard]] uint64_t record_checksum(const RecordHeader& h, std::span<const std::byte> payload) noexcept;

}  // namespace tier::journal
