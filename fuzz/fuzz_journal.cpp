// fuzz_journal: arbitrary bytes as a journal image and as a snapshot manifest.
//
// Properties checked beyond "no crash, no sanitizer report":
//   - the scan accounts for every byte: valid_end + dropped_bytes == size;
//   - the accepted prefix is canonical: re-encoding the header and the replayed records with
//     their sequence numbers reproduces bytes [0, valid_end) exactly;
//   - recovery is idempotent: scanning the accepted prefix accepts all of it, same records;
//   - a manifest that parses has a Begin, an End and a body consistent with them;
//   - when the records make a consistent CatalogImage, its live records rebuild an equal image
//     (what compaction relies on).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "journal/catalog_image.hpp"
#include "journal/format.hpp"
#include "journal/manifest.hpp"
#include "journal/reader.hpp"
#include "fuzz/fuzz_check.hpp"

using namespace tier;
using namespace tier::journal;

namespace {

void check_journal(std::span<const std::byte> in) {
  std::vector<Record> seen;
  std::vector<uint64_t> seqs;
  auto res = scan(in, kJournalMagic, [&](const Record& r, uint64_t seq, size_t) {
    seen.push_back(r);
    seqs.push_back(seq);
    return Status::ok();
  });
  if (!res) {
    Code c = res.error().code();
    FUZZ_CHECK(c == Code::kCorruption || c == Code::kUnsupported);
    return;
  }
  FUZZ_CHECK(res->valid_end + res->dropped_bytes == in.size());
  FUZZ_CHECK(res->records == seen.size());
  if (res->fresh) {
    FUZZ_CHECK(res->valid_end == 0 && in.size() < kFileHeaderBytes && seen.empty());
    return;
  }
  std::vector<std::byte> again;
  encode_file_header(kJournalMagic, res->first_seq, res->base_kib, again);
  for (size_t i = 0; i < seen.size(); ++i) {
    FUZZ_CHECK(seqs[i] == res->first_seq + i);
    FUZZ_CHECK(encode_record(seen[i], seqs[i], again).is_ok());
  }
  FUZZ_CHECK(again.size() == res->valid_end);
  FUZZ_CHECK(std::memcmp(again.data(), in.data(), again.size()) == 0);

  auto prefix = scan(in.first(res->valid_end), kJournalMagic, {});
  FUZZ_CHECK(prefix.has_value());
  FUZZ_CHECK(prefix->dropped_bytes == 0 && prefix->records == res->records &&
             prefix->last_seq == res->last_seq);

  CatalogImage image;
  for (const Record& r : seen) {
    if (!image.apply(r).is_ok()) return;
  }
  CatalogImage rebuilt;
  Status st = image.emit_live([&](const Record& r) { return rebuilt.apply(r); });
  FUZZ_CHECK(st.is_ok());
  FUZZ_CHECK(rebuilt == image);
}

void check_manifest(std::span<const std::byte> in) {
  auto m = parse_manifest(in);
  if (!m) return;
  FUZZ_CHECK(m->end.records == m->body.size());
  for (const Record& r : m->body)
    FUZZ_CHECK(!std::holds_alternative<ManifestBegin>(r) && !std::holds_alternative<ManifestEnd>(r));
}

// Checksums stop almost every mutation at the framing check, so half of the inputs are
// instead taken as records to frame with valid checksums: byte 0 odd, then repeated
// (u16 type, u16 payload length, payload). That lets the fuzzer reach payload decoding and
// CatalogImage.
std::vector<std::byte> synthesize(std::span<const std::byte> in) {
  std::vector<std::byte> image;
  encode_file_header(kJournalMagic, 1, 0, image);
  uint64_t seq = 1;
  size_t pos = 1;
  while (pos + 4 <= in.size()) {
    uint16_t type, len;
    std::memcpy(&type, in.data() + pos, 2);
    std::memcpy(&len, in.data() + pos + 2, 2);
    pos += 4;
    len = static_cast<uint16_t>(std::min<size_t>(len, in.size() - pos));
    RecordHeader h;
    h.payload_len = len;
    h.seq = seq++;
    h.type = type;
    auto payload = in.subspan(pos, len);
    h.checksum = record_checksum(h, payload);
    const size_t at = image.size();
    image.resize(at + sizeof h);
    std::memcpy(image.data() + at, &h, sizeof h);
    image.insert(image.end(), payload.begin(), payload.end());
    pos += len;
  }
  return image;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  if (size > 0 && (data[0] & 1)) {  // images start with 'T' (0x54): even
    auto image = synthesize(in);
    check_journal(image);
    return 0;
  }
  check_journal(in);
  check_manifest(in);
  return 0;
}
