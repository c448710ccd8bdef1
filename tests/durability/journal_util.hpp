// Helpers shared by the journal tests: a temporary directory, sample records of every type,
// and whole-file byte access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "journal/journal.hpp"
#include "journal/records.hpp"

namespace tier::journal::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string journal() const { return file(std::string(Journal::kFileName)); }

 private:
  std::string path_;
};

// One record of every RecordType, with non-default field values; `salt` varies them.
std::vector<Record> sample_records(uint64_t salt = 0);

std::vector<std::byte> read_file(const std::string& path);
void write_file(const std::string& path, const std::vector<std::byte>& bytes);
bool file_exists(const std::string& path);

// What a replay saw.
struct Replayed {
  std::vector<Record> records;
  std::vector<uint64_t> seqs;
  RecordVisitor visitor();
};

}  // namespace tier::journal::test
