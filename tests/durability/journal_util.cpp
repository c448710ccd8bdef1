#include "journal_util.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tier::journal::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/tier-journal-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<Record> sample_records(uint64_t salt) {
  std::vector<Record> v;
  v.push_back(PoolCreated{7 + salt, "job-" + std::to_string(salt), 1000, 1001, 1, 64ull << 30, 1ull << 40});
  v.push_back(PoolDropped{8 + salt});
  v.push_back(TensorCreated{7 + salt,
                            100 + salt,
                            "layer.0.weight",
                            4096 * 4096 * 2,
                            3,
                            {4096, 4096},
                            1,
                            2,
                            1ull << 21,
                            4096ull * 4096 * 2});
  v.push_back(TensorDeleted{7 + salt, 99 + salt});
  v.push_back(NvmeCopyWritten{100 + salt,
                              3 + salt,
                              {Extent{"/nvme0/tier", "data.0", 0, 1 << 20, 0xABCDEF0123456789ull},
                               Extent{"/nvme1/tier", "data.3", 1ull << 30, 1 << 20, 42 + salt}}});
  v.push_back(NvmeCopyDropped{100 + salt, 2 + salt});
  v.push_back(SnapshotBegun{7 + salt, 5 + salt, "/var/lib/tierd/snap/7/5"});
  v.push_back(SnapshotDurable{7 + salt, 5 + salt, "/var/lib/tierd/snap/7/5", 33554432});
  v.push_back(SnapshotDropped{7 + salt, 4 + salt});
  v.push_back(Watermarks{9 + salt, 1101 + salt, 6 + salt, 3, 17});
  v.push_back(TensorRamPlaced{100 + salt, 0, 1, 4096 * (salt + 1), 8192});
  v.push_back(TensorRamDropped{101 + salt});
  v.push_back(ArenaCreated{7 + salt, 1 + salt, 0, "/tier.state.n0", 1ull << 34});
  v.push_back(ManifestBegin{7 + salt, 5 + salt, 1700000000000ull + salt});
  v.push_back(ManifestEnd{3, 1 << 20});
  v.push_back(WriteLeaseHeld{100 + salt, (1ull << 32) | (4 + salt), 1000, -7, 123456 + salt, 4026531836ull});
  v.push_back(WriteLeaseEnded{100 + salt});
  v.push_back(SnapshotTagged{7 + salt, 5 + salt, 1200 + salt});
  v.push_back(PoolRecovered{7 + salt, 5 + salt, 3 + salt});
  v.push_back(PoolRestored{7 + salt, 5 + salt});
  return v;
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

void write_file(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

RecordVisitor Replayed::visitor() {
  return [this](const Record& r, uint64_t seq, size_t) {
    records.push_back(r);
    seqs.push_back(seq);
    return Status::ok();
  };
}

}  // namespace tier::journal::test
