// Record encoding: every record type survives encode -> scan -> decode unchanged, and the
// codec refuses what it must.
#include <catch2/catch.hpp>

#include <cstring>

#include "journal/format.hpp"
#include "journal/reader.hpp"
#include "journal/records.hpp"
#include "journal_util.hpp"

using namespace tier;
using namespace tier::journal;
using tier::journal::test::sample_records;

TEST_CASE("every record type round-trips through the file format", "[journal][records]") {
  auto recs = sample_records(3);
  REQUIRE(recs.size() == kMaxRecordType);
  std::vector<std::byte> image;
  encode_file_header(kJournalMagic, 41, 0, image);
  for (size_t i = 0; i < recs.size(); ++i) {
    CHECK(static_cast<size_t>(record_type(recs[i])) == i + 1);
    CHECK(record_type_name(record_type(recs[i])) != "unknown");
    REQUIRE(encode_record(recs[i], 41 + i, image).is_ok());
  }
  std::vector<Record> seen;
  std::vector<uint64_t> seqs;
  auto res = scan(image, kJournalMagic, [&](const Record& r, uint64_t seq, size_t) {
    seen.push_back(r);
    seqs.push_back(seq);
    return Status::ok();
  });
  REQUIRE(res.has_value());
  CHECK(res->records == recs.size());
  CHECK(res->first_seq == 41);
  CHECK(res->last_seq == 41 + recs.size() - 1);
  CHECK(res->valid_end == image.size());
  CHECK(res->dropped_bytes == 0);
  REQUIRE(seen.size() == recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    INFO("record " << i << " " << record_type_name(record_type(recs[i])));
    CHECK(seen[i] == recs[i]);
    CHECK(seqs[i] == 41 + i);
  }
}

TEST_CASE("payload decoding is strict", "[journal][records]") {
  std::vector<std::byte> payload;
  encode_payload(Record(TensorDeleted{1, 2}), payload);
  CHECK(decode_payload(static_cast<uint16_t>(RecordType::kTensorDeleted), payload).has_value());

  auto longer = payload;
  longer.push_back(std::byte{0});
  auto r1 = decode_payload(static_cast<uint16_t>(RecordType::kTensorDeleted), longer);
  REQUIRE_FALSE(r1.has_value());
  CHECK(r1.error().code() == Code::kCorruption);

  auto shorter = payload;
  shorter.pop_back();
  CHECK_FALSE(decode_payload(static_cast<uint16_t>(RecordType::kTensorDeleted), shorter));

  auto r2 = decode_payload(kMaxRecordType + 1, payload);
  REQUIRE_FALSE(r2.has_value());
  CHECK(r2.error().code() == Code::kUnsupported);
  CHECK(r2.error().message().find(std::to_string(kMaxRecordType + 1)) != std::string::npos);
  CHECK_FALSE(decode_payload(0, payload));
}

TEST_CASE("an oversized record is refused before anything is encoded", "[journal][records]") {
  NvmeCopyWritten big;
  big.tensor_id = 1;
  // Each extent carries two 4 KiB strings: about 4200 of them exceed the 16 MiB payload limit.
  Extent e{std::string(4096, 'd'), std::string(4096, 'f'), 0, 1, 2};
  big.extents.assign(kMaxPayloadBytes / 8192 + 16, e);
  std::vector<std::byte> out(5, std::byte{1});
  Status st = encode_record(big, 1, out);
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(out.size() == 5);
}

TEST_CASE("fsync policy names parse", "[journal]") {
  for (auto p : {FsyncPolicy::kAlways, FsyncPolicy::kBatch, FsyncPolicy::kNever}) {
    auto parsed = parse_fsync_policy(fsync_policy_name(p));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == p);
  }
  auto bad = parse_fsync_policy("sometimes");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == Code::kInvalidArgument);
  CHECK(bad.error().message().find("sometimes") != std::string::npos);
}
