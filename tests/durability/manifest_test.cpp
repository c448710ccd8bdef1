// Snapshot manifests: written atomically, read back whole, refused when not whole.
#include <catch2/catch.hpp>

#include "journal/format.hpp"
#include "journal/manifest.hpp"
#include "journal/reader.hpp"
#include "journal_util.hpp"

using namespace tier;
using namespace tier::journal;
using namespace tier::journal::test;

namespace {
std::vector<Record> manifest_body() {
  std::vector<Record> body = {PoolCreated{3, "job", 1000, 1000, 0, 1 << 30, 1ull << 34}};
  for (uint64_t t = 1; t <= 4; ++t) {
    body.push_back(TensorCreated{3, t, "w" + std::to_string(t), t << 20, 3, {int64_t(t), 512}, 0, 0, 0, 0});
    body.push_back(
        NvmeCopyWritten{t, 1, {Extent{"/snap", "p3.s9.data", (t - 1) << 20, t << 20, 0x1234 + t}}});
  }
  return body;
}
}  // namespace

TEST_CASE("a snapshot manifest round-trips", "[manifest]") {
  TempDir dir;
  const std::string path = dir.file("p3.s9.manifest");
  auto body = manifest_body();
  REQUIRE(write_manifest(path, ManifestBegin{3, 9, 1234}, body).is_ok());
  CHECK_FALSE(file_exists(path + ".tmp"));
  auto m = read_manifest(path);
  REQUIRE(m.has_value());
  CHECK(m->begin == ManifestBegin{3, 9, 1234});
  CHECK(m->body == body);
  CHECK(m->end.records == body.size());
  CHECK(m->end.bytes == (1 + 2 + 3 + 4) << 20);
}

TEST_CASE("a manifest that is not whole is refused, never truncated", "[manifest]") {
  TempDir dir;
  const std::string path = dir.file("m");
  REQUIRE(write_manifest(path, ManifestBegin{3, 9, 1234}, manifest_body()).is_ok());
  const auto full = read_file(path);
  for (size_t cut : {size_t{0}, size_t{10}, kFileHeaderBytes, full.size() / 2, full.size() - 1}) {
    INFO("cut at " << cut);
    auto m = parse_manifest(std::span<const std::byte>(full).first(cut));
    REQUIRE_FALSE(m.has_value());
    CHECK(m.error().code() == Code::kCorruption);
  }
  auto bad = full;
  bad[full.size() / 2] ^= std::byte{8};
  CHECK_FALSE(parse_manifest(bad).has_value());
  // A journal is not a manifest.
  std::vector<std::byte> j;
  encode_file_header(kJournalMagic, 1, 0, j);
  CHECK_FALSE(parse_manifest(j).has_value());
  CHECK(write_manifest(path, ManifestBegin{}, std::vector<Record>{ManifestEnd{}}).code() ==
        Code::kInvalidArgument);
  CHECK(read_manifest(dir.file("missing")).error().code() == Code::kNotFound);
}
