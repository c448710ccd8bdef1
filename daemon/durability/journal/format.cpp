#include "journal/format.hpp"

#include <xxhash.h>

namespace tier::journal {

uint64_t file_header_checksum(const FileHeader& h) noexcept {
  return XXH3_64bits(&h, kFileHeaderChecksummed);
}

uint64_t record_checksum(const RecordHeader& h, std::span<const std::byte> payload) noexcept {
  uint64_t seed = XXH3_64bits(&h, kRecordHeaderChecksummed);
  return XXH3_64bits_withSeed(payload.data(), payload.size(), seed);
}

}  // namespace tier::journal
