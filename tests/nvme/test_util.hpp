// Helpers shared by the NVMe tests: temporary directories and aligned, patterned buffers.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>

namespace tier::nvme::testing {

// A fresh directory under `parent`, removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp") {
    std::string tmpl = parent + "/tier-nvme-test.XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    path_ = p ? std::string(p) : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// `n` bytes (at least 1) aligned to 4 KiB, plus `shift` bytes of misalignment when asked.
class Buffer {
 public:
  explicit Buffer(size_t n, size_t shift = 0) : n_(n), shift_(shift) {
    size_t total = ((n + shift + 4095) / 4096 + 1) * 4096;
    mem_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, total)));
    std::memset(mem_.get(), 0, total);
  }
  std::byte* data() { return mem_.get() + shift_; }
  std::span<std::byte> span() { return {data(), n_}; }
  std::span<const std::byte> cspan() { return {data(), n_}; }
  size_t size() const { return n_; }
  void fill(uint64_t seed) {
    std::mt19937_64 g(seed);
    size_t i = 0;
    for (; i + 8 <= n_; i += 8) {
      uint64_t v = g();
      std::memcpy(data() + i, &v, 8);
    }
    for (; i < n_; ++i) data()[i] = std::byte(g() & 0xff);
  }

 private:
  size_t n_, shift_;
  std::unique_ptr<std::byte, FreeDeleter> mem_;
};

}  // namespace tier::nvme::testing
