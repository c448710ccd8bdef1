// Training text for tier-train: bytes of a file (or of the texts under
// /usr/share/common-licenses), a train/validation split and deterministic batches.
//
// Batches depend only on (seed, step, global sequence index), never on the rank count: rank r
// of R takes the global sequences [r*B/R, (r+1)*B/R) of the same global batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tier/status.hpp"

namespace tier::train {

class Dataset {
 public:
  // Reads `path` (a file), or every regular file under /usr/share/common-licenses when empty.
  // The last `val_frac` of the bytes are held out. Fails when either part is shorter than T+1.
  [[nodiscard]] static Result<Dataset> load(const std::string& path, int T, double val_frac = 0.1);

  // Fills tokens and targets [count, T] with global sequences [first, first+count) of step `step`.
  void train_batch(uint64_t seed, int64_t step, int first, int count, int T, int32_t* tokens,
                   int32_t* targets) const;
  // Validation sequences [first, first+count): fixed, evenly spaced windows of the held-out part.
  void val_batch(int first, int count, int total, int T, int32_t* tokens, int32_t* targets) const;

  size_t train_bytes() const { return split_; }
  size_t val_bytes() const { return bytes_.size() - split_; }
  const std::string& source() const { return source_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t split_ = 0;
  std::string source_;
};

}  // namespace tier::train
