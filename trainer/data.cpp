#include "trainer/data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "trainer/model.hpp"
#include "wire/errors.hpp"

namespace tier::train {

namespace {
Status append_file(const std::filesystem::path& p, std::vector<uint8_t>& out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {Code::kNotFound, fmt::format("cannot read data file '{}'", p.string())};
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return {};
}
}  // namespace

Result<Dataset> Dataset::load(const std::string& path, int T, double val_frac) {
  Dataset d;
  if (!path.empty()) {
    if (auto s = append_file(path, d.bytes_); !s) return fail(s);
    d.source_ = path;
  } else {
    const std::filesystem::path dir = "/usr/share/common-licenses";
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    if (ec) return fail(Code::kNotFound, fmt::format("cannot list {}: {}", dir.string(), ec.message()));
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      if (auto s = append_file(f, d.bytes_); !s) return fail(s);
    d.source_ = dir.string();
  }
  const size_t n = d.bytes_.size();
  d.split_ = n - static_cast<size_t>(static_cast<double>(n) * val_frac);
  const size_t need = static_cast<size_t>(T) + 1;
  if (d.split_ < need || n - d.split_ < need)
    return fail(Code::kInvalidArgument,
                fmt::format("data '{}' has {} bytes: too short for sequences of {} with a {:.0f}% "
                            "held-out split",
                            d.source_, n, T, val_frac * 100));
  return d;
}

void Dataset::train_batch(uint64_t seed, int64_t step, int first, int count, int T, int32_t* tokens,
                          int32_t* targets) const {
  const uint64_t windows = split_ - static_cast<size_t>(T);  // start offsets with T+1 bytes
  for (int j = 0; j < count; ++j) {
    const uint64_t off =
        mix_seed(mix_seed(seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(first + j)) % windows;
    for (int t = 0; t < T; ++t) {
      tokens[static_cast<size_t>(j) * T + t] = bytes_[off + t];
      targets[static_cast<size_t>(j) * T + t] = bytes_[off + t + 1];
    }
  }
}

void Dataset::val_batch(int first, int count, int total, int T, int32_t* tokens, int32_t* targets) const {
  const size_t windows = val_bytes() - static_cast<size_t>(T);
  for (int j = 0; j < count; ++j) {
    const size_t off = split_ + windows * static_cast<size_t>(first + j) / std::max(total, 1);
    for (int t = 0; t < T; ++t) {
      tokens[static_cast<size_t>(j) * T + t] = bytes_[off + t];
      targets[static_cast<size_t>(j) * T + t] = bytes_[off + t + 1];
    }
  }
}

}  // namespace tier::train
