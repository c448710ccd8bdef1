#include "journal/reader.hpp"
#include "base/errors.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace tier::journal {
namespace {

std::string kind_name(uint64_t magic) { return magic == kManifestMagic ? "snapshot manifest" : "journal"; }

// Why a record frame at some offset is not valid; kOk when it is.
enum class Frame { kOk, kShort, kMagic, kReserved, kLength, kTruncated, kChecksum };

const char* frame_reason(Frame f) {
  switch (f) {
    case Frame::kOk: return "ok";
    case Frame::kShort: return "incomplete record header";
    case Frame::kMagic: return "bad record magic";
    case Frame::kReserved: return "nonzero reserved header fields";
    case Frame::kLength: return "payload length above the format limit";
    case Frame::kTruncated: return "payload runs past the end of the file";
    case Frame::kChecksum: return "checksum mismatch";
  }
  return "?";
}

Frame check_frame(std::span<const std::byte> file, size_t pos, RecordHeader& h) {
  if (file.size() - pos < kRecordHeaderBytes) return Frame::kShort;
  std::memcpy(&h, file.data() + pos, kRecordHeaderBytes);
  if (h.magic != kRecordMagic) return Frame::kMagic;
  if (h.flags != 0 || h.reserved != 0) return Frame::kReserved;
  if (h.payload_len > kMaxPayloadBytes) return Frame::kLength;
  if (file.size() - pos - kRecordHeaderBytes < h.payload_len) return Frame::kTruncated;
  if (record_checksum(h, file.subspan(pos + kRecordHeaderBytes, h.payload_len)) != h.checksum)
    return Frame::kChecksum;
  return Frame::kOk;
}

// Offset of the first valid record frame after `from` whose seq is >= min_seq, or 0.
size_t find_valid_record_after(std::span<const std::byte> file, size_t from, uint64_t min_seq) {
  for (size_t q = from + 1; q + kRecordHeaderBytes <= file.size(); ++q) {
    uint32_t magic;
    std::memcpy(&magic, file.data() + q, sizeof magic);
    if (magic != kRecordMagic) continue;
    RecordHeader h;
    if (check_frame(file, q, h) == Frame::kOk && h.seq >= min_seq) return q;
  }
  return 0;
}

Status check_file_header(std::span<const std::byte> file, uint64_t magic, ScanResult& out) {
  const std::string kind = kind_name(magic);
  if (file.size() < kFileHeaderBytes) {
    // A header is written with one write(); a crash while creating the file can leave a
    // prefix of it. Anything other than a prefix of our magic is not ours to overwrite.
    size_t n = std::min(file.size(), sizeof magic);
    if (n > 0 && std::memcmp(file.data(), &magic, n) != 0)
      return Status(Code::kCorruption, "not a tierd " + kind + ": " + std::to_string(file.size()) +
                                           " bytes that do not start with its magic");
    out.fresh = true;
    out.valid_end = 0;
    out.dropped_bytes = file.size();
    return Status::ok();
  }
  FileHeader h;
  std::memcpy(&h, file.data(), kFileHeaderBytes);
  if (h.magic != magic) {
    if (h.magic == kJournalMagic || h.magic == kManifestMagic)
      return Status(Code::kCorruption, "expected a tierd " + kind + " but found a " + kind_name(h.magic));
    return Status(Code::kCorruption, "not a tierd " + kind + " (bad magic in the file header)");
  }
  if (file_header_checksum(h) != h.checksum)
    return Status(Code::kCorruption, "the " + kind + "'s file header is damaged (checksum mismatch)");
  if (h.version > kFormatVersion)
    return Status(Code::kUnsupported, "the " + kind + " has format version " + std::to_string(h.version) +
                                          ", newer than this tierd's " + std::to_string(kFormatVersion) +
                                          ": upgrade tierd to read it");
  if (h.version == 0 || h.flags != 0)
    return Status(Code::kCorruption, "the " + kind + "'s file header has invalid fields");
  if (h.first_seq == 0)
    return Status(Code::kCorruption, "the " + kind + "'s file header has first sequence 0");
  out.first_seq = h.first_seq;
  out.base_kib = h.base_kib;
  out.last_seq = h.first_seq - 1;
  out.valid_end = kFileHeaderBytes;
  return Status::ok();
}

}  // namespace

Result<ScanResult> scan(std::span<const std::byte> file, uint64_t magic, const RecordVisitor& visit) {
  ScanResult out;
  TIER_TRY(check_file_header(file, magic, out));
  if (out.fresh) return out;
  const std::string kind = kind_name(magic);

  // Pass 1: framing, checksums, sequence numbers and types, without decoding.
  size_t pos = kFileHeaderBytes;
  uint64_t expected = out.first_seq;
  while (pos < file.size()) {
    RecordHeader h;
    Frame f = check_frame(file, pos, h);
    if (f != Frame::kOk) {
      size_t next = find_valid_record_after(file, pos, expected);
      if (next != 0)
        return fail(Code::kCorruption, "the " + kind + " is corrupt at offset " + std::to_string(pos) + " (" +
                                           frame_reason(f) + ") with valid records after it (offset " +
                                           std::to_string(next) + "): refusing to drop them; seq " +
                                           std::to_string(expected) + " onwards would be lost");
      out.dropped_bytes = file.size() - pos;
      break;
    }
    if (h.seq != expected)
      return fail(Code::kCorruption, "the " + kind + " record at offset " + std::to_string(pos) +
                                         " has sequence " + std::to_string(h.seq) + ", expected " +
                                         std::to_string(expected));
    if (h.type == 0 || h.type > kMaxRecordType)
      return fail(Code::kUnsupported,
                  "the " + kind + " record at offset " + std::to_string(pos) + " has type " +
                      std::to_string(h.type) + ", unknown to this tierd (format version " +
                      std::to_string(kFormatVersion) + "); it was written by a newer tierd");
    pos += kRecordHeaderBytes + h.payload_len;
    ++expected;
    ++out.records;
  }
  out.valid_end = pos;
  out.last_seq = expected - 1;

  // Pass 2: decode and visit the records pass 1 accepted.
  // Decoding runs even without a visitor, so a file that would fail to replay fails
  // validation too.
  pos = kFileHeaderBytes;
  while (pos < out.valid_end) {
    RecordHeader h;
    std::memcpy(&h, file.data() + pos, kRecordHeaderBytes);
    auto rec = decode_payload(h.type, file.subspan(pos + kRecordHeaderBytes, h.payload_len));
    if (!rec)
      return fail(rec.error().code(), "the " + kind + " record at offset " + std::to_string(pos) + " (seq " +
                                          std::to_string(h.seq) + "): " + rec.error().message());
    if (visit) { TIER_TRY(visit(*rec, h.seq, pos)); }
    pos += kRecordHeaderBytes + h.payload_len;
  }
  return out;
}

Status encode_record(const Record& record, uint64_t seq, std::vector<std::byte>& out) {
  const size_t start = out.size();
  out.resize(start + kRecordHeaderBytes);
  encode_payload(record, out);
  const size_t payload_len = out.size() - start - kRecordHeaderBytes;
  if (payload_len > kMaxPayloadBytes) {
    out.resize(start);
    return Status(Code::kInvalidArgument, std::string(record_type_name(record_type(record))) + " record of " +
                                              std::to_string(payload_len) +
                                              " bytes exceeds the journal's limit of " +
                                              std::to_string(kMaxPayloadBytes) + " bytes");
  }
  RecordHeader h;
  h.payload_len = static_cast<uint32_t>(payload_len);
  h.seq = seq;
  h.type = static_cast<uint16_t>(record_type(record));
  h.checksum =
      record_checksum(h, std::span<const std::byte>(out.data() + start + kRecordHeaderBytes, payload_len));
  std::memcpy(out.data() + start, &h, kRecordHeaderBytes);
  return Status::ok();
}

void encode_file_header(uint64_t magic, uint64_t first_seq, uint32_t base_kib, std::vector<std::byte>& out) {
  FileHeader h;
  h.magic = magic;
  h.base_kib = base_kib;
  h.first_seq = first_seq;
  h.checksum = file_header_checksum(h);
  const size_t start = out.size();
  out.resize(start + kFileHeaderBytes);
  std::memcpy(out.data() + start, &h, kFileHeaderBytes);
}

}  // namespace tier::journal
