// fuzz_journal: arbitrary bytes as a journal image and as a snapshot manifest.
//
// Properties checked beyond "no crash, no sanitizer report":
//   - the scan accounts for every byte: valid_end + dropped_bytes == size;
//   - the accepted prefix is canonical: re-encoding the header and the replayed records with
//     their sequence numbers reproduces bytes [0, valid_end) exactly;
//   - recovery is idempotent: scanning the accepted prefix accepts all of it, same records;
//   - a manifest that parses has a Begin, an End and a body consistent with them.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "daemon/journal/format.hpp"
#include "daemon/journal/manifest.hpp"
#include "daemon/journal/reader.hpp"
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
}

void check_manifest(std::span<const std::byte> in) {
  auto m = parse_manifest(in);
  if (!m) return;
  FUZZ_CHECK(m->end.records == m->body.size());
  for (const Record& r : m->body)
    FUZZ_CHECK(!std::holds_alternative<ManifestBegin>(r) && !std::holds_alternative<ManifestEnd>(r));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check_journal(in);
  check_manifest(in);
  return 0;
}
