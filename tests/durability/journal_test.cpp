// The catalog journal on disk: append and replay, torn tails, corruption, compaction, locking
// and the fsync policies.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "journal/format.hpp"
#include "journal/journal.hpp"
#include "journal/reader.hpp"
#include "journal_util.hpp"
#include "base/errors.hpp"

using namespace tier;
using namespace tier::journal;
using namespace tier::journal::test;

namespace {

std::unique_ptr<Journal> open_ok(const TempDir& dir, Replayed* seen = nullptr, OpenReport* report = nullptr,
                                 JournalOptions opts = {}) {
  Replayed local;
  Replayed& r = seen ? *seen : local;
  auto j = Journal::open(dir.path(), opts, r.visitor(), report);
  if (!j) FAIL("open failed: " << j.error().to_string());
  return std::move(*j);
}

// Writes `recs` into a new journal and returns the file offset at which each record starts
// plus the end offset.
std::vector<size_t> write_journal(const TempDir& dir, const std::vector<Record>& recs) {
  auto j = open_ok(dir);
  std::vector<size_t> offsets;
  for (const Record& r : recs) {
    offsets.push_back(j->size_bytes());
    auto seq = j->append(r);
    REQUIRE(seq.has_value());
  }
  offsets.push_back(j->size_bytes());
  REQUIRE(j->sync().is_ok());
  return offsets;
}

// sample_records() written to a fresh journal in `dir`: the records, their offsets (as
// write_journal returns them), and the file's bytes.
struct SampleJournal {
  std::vector<Record> recs;
  std::vector<size_t> offsets;
  std::vector<std::byte> full;
};
SampleJournal write_sample(const TempDir& dir) {
  SampleJournal j{sample_records(), {}, {}};
  j.offsets = write_journal(dir, j.recs);
  j.full = read_file(dir.journal());
  return j;
}

std::vector<Record> churn_records(int n) {
  std::vector<Record> v;
  for (int i = 0; i < n; ++i) {
    v.push_back(TensorCreated{
        1, uint64_t(i + 1), "t" + std::to_string(i), 4096, 1, {1024}, 0, 1, uint64_t(i) * 4096, 4096});
    if (i % 2 == 1) v.push_back(TensorDeleted{1, uint64_t(i + 1)});
  }
  return v;
}

}  // namespace

TEST_CASE("a new journal is created, appended to and replayed after reopen", "[journal]") {
  TempDir dir;
  auto recs = sample_records();
  {
    OpenReport rep;
    auto j = open_ok(dir, nullptr, &rep);
    CHECK(rep.created);
    CHECK(rep.records == 0);
    CHECK(rep.last_seq == 0);
    CHECK(j->size_bytes() == kFileHeaderBytes);
    for (size_t i = 0; i < recs.size(); ++i) {
      auto seq = j->append(recs[i]);
      REQUIRE(seq.has_value());
      CHECK(*seq == i + 1);
    }
    CHECK(j->last_seq() == recs.size());
  }
  Replayed seen;
  OpenReport rep;
  {
    auto j = open_ok(dir, &seen, &rep);
    CHECK_FALSE(rep.created);
    CHECK(rep.records == recs.size());
    CHECK(rep.dropped_tail_bytes == 0);
    REQUIRE(seen.records == recs);
    for (size_t i = 0; i < seen.seqs.size(); ++i) CHECK(seen.seqs[i] == i + 1);
    // Appends after a reopen continue the sequence.
    auto seq = j->append(PoolDropped{77});
    REQUIRE(seq.has_value());
    CHECK(*seq == recs.size() + 1);
  }
  Replayed again;
  auto j = open_ok(dir, &again);
  REQUIRE(again.records.size() == recs.size() + 1);
  CHECK(again.records.back() == Record(PoolDropped{77}));
}

TEST_CASE("an empty journal file opens as a new journal", "[journal]") {
  TempDir dir;
  write_file(dir.journal(), {});
  OpenReport rep;
  Replayed seen;
  auto j = open_ok(dir, &seen, &rep);
  CHECK(seen.records.empty());
  CHECK(rep.records == 0);
  REQUIRE(j->append(PoolDropped{1}).has_value());
  j.reset();
  Replayed after;
  open_ok(dir, &after);
  CHECK(after.records == std::vector<Record>{PoolDropped{1}});
}

TEST_CASE("a torn file header (creation cut short) is rewritten", "[journal]") {
  TempDir dir;
  std::vector<std::byte> hdr;
  encode_file_header(kJournalMagic, 1, 0, hdr);
  for (size_t cut = 1; cut < kFileHeaderBytes; ++cut) {
    INFO("cut at " << cut);
    write_file(dir.journal(), std::vector<std::byte>(hdr.begin(), hdr.begin() + cut));
    OpenReport rep;
    auto j = open_ok(dir, nullptr, &rep);
    CHECK(rep.records == 0);
    CHECK(rep.dropped_tail_bytes == cut);
    CHECK(read_file(dir.journal()).size() == kFileHeaderBytes);
  }
}

TEST_CASE("a torn tail at every byte of the last record is truncated, nothing before it lost",
          "[journal][torn]") {
  TempDir dir;
  const auto [recs, offsets, full] = write_sample(dir);
  const size_t last = offsets[recs.size() - 1];
  REQUIRE(full.size() == offsets.back());
  std::vector<Record> expect(recs.begin(), recs.end() - 1);
  size_t trials = 0;
  for (size_t cut = last; cut < full.size(); ++cut) {
    INFO("cut at " << cut << " of " << full.size() << " (last record at " << last << ")");
    write_file(dir.journal(), std::vector<std::byte>(full.begin(), full.begin() + cut));
    Replayed seen;
    OpenReport rep;
    {
      auto j = open_ok(dir, &seen, &rep);
      CHECK(seen.records == expect);
      CHECK(rep.dropped_tail_bytes == cut - last);
      CHECK(rep.last_seq == recs.size() - 1);
      CHECK(j->size_bytes() == last);
    }
    CHECK(read_file(dir.journal()).size() == last);
    ++trials;
  }
  // Zeros instead of the last record (an extended file whose data never hit the disk).
  auto zeroed = full;
  std::memset(zeroed.data() + last, 0, full.size() - last);
  write_file(dir.journal(), zeroed);
  Replayed seen;
  OpenReport rep;
  {
    auto j = open_ok(dir, &seen, &rep);
    CHECK(seen.records == expect);
    CHECK(rep.dropped_tail_bytes == full.size() - last);
    // The recovered journal takes appends, which a later open replays.
    auto seq = j->append(recs.back());
    REQUIRE(seq.has_value());
    CHECK(*seq == recs.size());
  }
  Replayed after;
  open_ok(dir, &after);
  CHECK(after.records == recs);
  CHECK(trials == full.size() - last);
}

TEST_CASE("a truncated journal keeps every record that is whole", "[journal][torn]") {
  TempDir dir;
  const auto [recs, offsets, full] = write_sample(dir);
  for (size_t i = 1; i + 1 < offsets.size(); ++i) {
    // Cut in the middle of record i: records before it survive, later ones were never written.
    size_t cut = (offsets[i] + offsets[i + 1]) / 2;
    write_file(dir.journal(), std::vector<std::byte>(full.begin(), full.begin() + cut));
    Replayed seen;
    OpenReport rep;
    open_ok(dir, &seen, &rep);
    CHECK(seen.records == std::vector<Record>(recs.begin(), recs.begin() + i));
    CHECK(rep.dropped_tail_bytes == cut - offsets[i]);
  }
}

TEST_CASE("a flipped byte before the last record is corruption: refused, file untouched",
          "[journal][corruption]") {
  TempDir dir;
  const auto [recs, offsets, full] = write_sample(dir);
  // Every byte of the second and of the second-to-last record, and of the file header.
  std::vector<std::pair<size_t, size_t>> ranges = {
      {0, kFileHeaderBytes}, {offsets[1], offsets[2]}, {offsets[recs.size() - 2], offsets[recs.size() - 1]}};
  size_t refused = 0;
  for (auto [from, to] : ranges) {
    for (size_t pos = from; pos < to; ++pos) {
      INFO("flipped byte at " << pos);
      auto bad = full;
      bad[pos] ^= std::byte{0x40};
      write_file(dir.journal(), bad);
      Replayed seen;
      auto j = Journal::open(dir.path(), {}, seen.visitor());
      REQUIRE_FALSE(j.has_value());
      CHECK(j.error().code() == Code::kCorruption);
      if (pos >= kFileHeaderBytes)
        CHECK(j.error().message().find("offset " + std::to_string(from)) != std::string::npos);
      CHECK(seen.records.empty());  // nothing replayed from a refused journal
      CHECK(read_file(dir.journal()) == bad);
      ++refused;
    }
  }
  WARN("refused " << refused << " single-byte corruptions");
}

TEST_CASE("a flipped byte in the last record is indistinguishable from a torn write", "[journal][torn]") {
  TempDir dir;
  auto recs = sample_records();
  auto offsets = write_journal(dir, recs);
  auto bad = read_file(dir.journal());
  bad[offsets[recs.size() - 1] + kRecordHeaderBytes + 1] ^= std::byte{1};
  write_file(dir.journal(), bad);
  Replayed seen;
  OpenReport rep;
  open_ok(dir, &seen, &rep);
  CHECK(seen.records.size() == recs.size() - 1);
  CHECK(rep.dropped_tail_bytes == offsets.back() - offsets[recs.size() - 1]);
}

TEST_CASE("files that are not journals, newer formats and unknown records are refused",
          "[journal][corruption]") {
  TempDir dir;
  SECTION("random text") {
    std::string text = "this is not a journal, it is a note left by someone else entirely";
    std::vector<std::byte> b(text.size());
    std::memcpy(b.data(), text.data(), text.size());
    write_file(dir.journal(), b);
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code() == Code::kCorruption);
    CHECK(read_file(dir.journal()) == b);
  }
  SECTION("a short file that is not a header prefix") {
    write_file(dir.journal(), std::vector<std::byte>(10, std::byte{'x'}));
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code() == Code::kCorruption);
  }
  SECTION("a newer format version") {
    FileHeader h;
    h.version = kFormatVersion + 1;
    h.checksum = file_header_checksum(h);
    std::vector<std::byte> b(sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
    write_file(dir.journal(), b);
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code() == Code::kUnsupported);
    CHECK(j.error().message().find("version " + std::to_string(kFormatVersion + 1)) != std::string::npos);
  }
  SECTION("a record type from a newer tierd") {
    std::vector<std::byte> b;
    encode_file_header(kJournalMagic, 1, 0, b);
    REQUIRE(encode_record(PoolDropped{1}, 1, b).is_ok());
    const size_t at = b.size();
    REQUIRE(encode_record(PoolDropped{2}, 2, b).is_ok());
    RecordHeader h;
    std::memcpy(&h, b.data() + at, sizeof h);
    h.type = 200;
    h.checksum = record_checksum(h, std::span<const std::byte>(b).subspan(at + sizeof h));
    std::memcpy(b.data() + at, &h, sizeof h);
    write_file(dir.journal(), b);
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code() == Code::kUnsupported);
    CHECK(j.error().message().find("type 200") != std::string::npos);
    CHECK(j.error().message().find("version " + std::to_string(kFormatVersion)) != std::string::npos);
  }
  SECTION("a gap in the sequence numbers") {
    std::vector<std::byte> b;
    encode_file_header(kJournalMagic, 1, 0, b);
    REQUIRE(encode_record(PoolDropped{1}, 1, b).is_ok());
    REQUIRE(encode_record(PoolDropped{2}, 3, b).is_ok());
    write_file(dir.journal(), b);
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code() == Code::kCorruption);
    CHECK(j.error().message().find("sequence 3") != std::string::npos);
  }
  SECTION("a snapshot manifest in place of the journal") {
    std::vector<std::byte> b;
    encode_file_header(kManifestMagic, 1, 0, b);
    write_file(dir.journal(), b);
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE_FALSE(j.has_value());
    CHECK(j.error().code() == Code::kCorruption);
    CHECK(j.error().message().find("manifest") != std::string::npos);
  }
}

TEST_CASE("a replay error aborts open and is returned", "[journal]") {
  TempDir dir;
  write_journal(dir, sample_records());
  int calls = 0;
  auto j = Journal::open(dir.path(), {}, [&](const Record&, uint64_t seq, size_t) {
    ++calls;
    return seq == 3 ? Status(Code::kInternal, "catalog rejects record 3") : Status::ok();
  });
  REQUIRE_FALSE(j.has_value());
  CHECK(j.error().code() == Code::kInternal);
  CHECK(calls == 3);
}

TEST_CASE("one writer per directory", "[journal]") {
  TempDir dir;
  auto first = open_ok(dir);
  auto second = Journal::open(dir.path(), {}, {});
  REQUIRE_FALSE(second.has_value());
  CHECK(second.error().code() == Code::kBusy);
  first.reset();
  CHECK(Journal::open(dir.path(), {}, {}).has_value());
  auto missing = Journal::open(dir.path() + "/nope", {}, {});
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code() == Code::kNotFound);
}

TEST_CASE("fsync policies: what committed_seq promises", "[journal]") {
  TempDir dir;
  SECTION("batch commits at sync()") {
    auto j = open_ok(dir, nullptr, nullptr, {.fsync = FsyncPolicy::kBatch});
    REQUIRE(j->append(PoolDropped{1}).has_value());
    REQUIRE(j->append(PoolDropped{2}).has_value());
    CHECK(j->last_seq() == 2);
    CHECK(j->committed_seq() == 0);
    REQUIRE(j->sync().is_ok());
    CHECK(j->committed_seq() == 2);
    REQUIRE(j->sync().is_ok());  // nothing pending
  }
  SECTION("always commits each append") {
    auto j = open_ok(dir, nullptr, nullptr, {.fsync = FsyncPolicy::kAlways});
    REQUIRE(j->append(PoolDropped{1}).has_value());
    CHECK(j->committed_seq() == 1);
  }
  SECTION("never commits on write") {
    auto j = open_ok(dir, nullptr, nullptr, {.fsync = FsyncPolicy::kNever});
    REQUIRE(j->append(PoolDropped{1}).has_value());
    CHECK(j->committed_seq() == 1);
    REQUIRE(j->sync().is_ok());
  }
  // Whatever the policy, a record written is read back by the next open.
  Replayed seen;
  open_ok(dir, &seen);
  CHECK_FALSE(seen.records.empty());
}

TEST_CASE("an oversized append fails cleanly and the journal stays usable", "[journal]") {
  TempDir dir;
  auto j = open_ok(dir);
  NvmeCopyWritten big;
  big.extents.assign(kMaxPayloadBytes / 8192 + 16,
                     Extent{std::string(4096, 'd'), std::string(4096, 'f'), 0, 1, 2});
  auto r = j->append(big);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == Code::kInvalidArgument);
  CHECK(j->health().is_ok());
  REQUIRE(j->append(PoolDropped{1}).has_value());
  CHECK(j->last_seq() == 1);
}

TEST_CASE("compaction keeps exactly the live state and continues the sequence", "[journal][compaction]") {
  TempDir dir;
  auto churn = churn_records(200);
  std::vector<Record> live = {Watermarks{2, 201, 1, 2, 1}, PoolCreated{1, "p", 0, 0, 0, 1, 2}};
  for (int i = 0; i < 200; i += 2)
    live.push_back(TensorCreated{
        1, uint64_t(i + 1), "t" + std::to_string(i), 4096, 1, {1024}, 0, 1, uint64_t(i) * 4096, 4096});
  uint64_t before_size = 0, before_seq = 0;
  {
    auto j = open_ok(dir, nullptr, nullptr, {.compact_ratio = 1.2, .compact_min_bytes = 4096});
    for (const Record& r : churn) REQUIRE(j->append(r).has_value());
    CHECK(j->compaction_due());
    before_size = j->size_bytes();
    before_seq = j->last_seq();
    REQUIRE(j->compact(live).is_ok());
    CHECK(j->size_bytes() < before_size);
    CHECK(j->base_bytes() == j->size_bytes() - kFileHeaderBytes);
    CHECK_FALSE(j->compaction_due());
    CHECK(j->last_seq() == before_seq + live.size());
    CHECK(j->committed_seq() == j->last_seq());
    CHECK_FALSE(file_exists(dir.file(std::string(Journal::kCompactName))));
    auto seq = j->append(TensorDeleted{1, 1});
    REQUIRE(seq.has_value());
    CHECK(*seq == before_seq + live.size() + 1);
  }
  Replayed seen;
  OpenReport rep;
  auto j = open_ok(dir, &seen, &rep, {.compact_ratio = 1.2, .compact_min_bytes = 4096});
  auto expect = live;
  expect.push_back(TensorDeleted{1, 1});
  CHECK(seen.records == expect);
  CHECK(rep.first_seq == before_seq + 1);
  CHECK(seen.seqs.front() == before_seq + 1);
  // The live-size estimate survives the reopen (rounded up to KiB).
  CHECK(j->base_bytes() >= j->size_bytes() - kFileHeaderBytes - 200);
  CHECK_FALSE(j->compaction_due());
}

TEST_CASE("a crash between writing the compacted file and renaming it loses nothing",
          "[journal][compaction]") {
  TempDir dir;
  auto churn = churn_records(50);
  std::vector<Record> live = {PoolCreated{1, "p", 0, 0, 0, 1, 2}};
  write_journal(dir, churn);
  const auto old_image = read_file(dir.journal());
  {
    auto j = open_ok(dir);
    REQUIRE(j->compact(live).is_ok());
  }
  const auto new_image = read_file(dir.journal());
  REQUIRE(new_image != old_image);
  const std::string tmp = dir.file(std::string(Journal::kCompactName));

  SECTION("the whole temp file was written") {
    // The state a crash just before rename() leaves: old journal + a complete temp file.
    write_file(dir.journal(), old_image);
    write_file(tmp, new_image);
  }
  SECTION("the temp file was cut short") {
    write_file(dir.journal(), old_image);
    write_file(tmp, std::vector<std::byte>(new_image.begin(), new_image.begin() + 40));
  }
  Replayed seen;
  OpenReport rep;
  auto j = open_ok(dir, &seen, &rep);
  CHECK(rep.removed_stale_compaction);
  CHECK(seen.records == churn);
  CHECK_FALSE(file_exists(tmp));
  CHECK(read_file(dir.journal()) == old_image);
}

TEST_CASE("a failing compaction producer leaves the old journal in use", "[journal][compaction]") {
  TempDir dir;
  auto recs = sample_records();
  write_journal(dir, recs);
  auto j = open_ok(dir);
  Status st = j->compact([](const Journal::Emit& emit) -> Status {
    TIER_RETURN_IF_ERROR(emit(PoolDropped{1}));
    return Status(Code::kInternal, "catalog walk failed");
  });
  CHECK(st.code() == Code::kInternal);
  CHECK_FALSE(file_exists(dir.file(std::string(Journal::kCompactName))));
  REQUIRE(j->append(PoolDropped{9}).has_value());
  j.reset();
  Replayed seen;
  open_ok(dir, &seen);
  auto expect = recs;
  expect.push_back(PoolDropped{9});
  CHECK(seen.records == expect);
}

TEST_CASE("inspect_journal reads without repairing", "[journal]") {
  TempDir dir;
  auto recs = sample_records();
  auto offsets = write_journal(dir, recs);
  auto full = read_file(dir.journal());
  full.resize(full.size() - 3);
  write_file(dir.journal(), full);
  Replayed seen;
  auto res = inspect_journal(dir.journal(), seen.visitor());
  REQUIRE(res.has_value());
  CHECK(res->records == recs.size() - 1);
  CHECK(res->dropped_bytes == offsets.back() - 3 - offsets[recs.size() - 1]);
  CHECK(read_file(dir.journal()).size() == full.size());
}
