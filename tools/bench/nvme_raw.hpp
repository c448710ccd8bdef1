// The raw ceiling of tier-bench nvme: what the device under a directory does for sequential
// O_DIRECT writes and reads of the same bytes, measured by several candidates in the same run,
// so that the engine is compared with the best of them rather than with one fixed loop.
//
//   io_uring qdQ bsB   tier-bench's own loop: one preallocated, already written file, requests
//                      of B bytes with Q in flight, unregistered buffers, no flush.
//   fio <engine> ...   fio (when installed) with the same pattern on the same file:
//                      --rw=write|read --direct=1 --bs --iodepth --ioengine io_uring or libaio.
//
// RawCeiling::sample() runs every candidate once; the medians over samples are compared and
// the best one is the baseline (best() says which).
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tier::bench {

// One preallocated O_DIRECT file and an io_uring loop over it.
class RawFile {
 public:
  RawFile() = default;
  ~RawFile();
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  // Creates `path` (removed by the destructor), fallocates `size` bytes and writes them once,
  // so later writes overwrite written blocks (as fio and DeepNVMe rewriting a file do).
  bool open(const std::string& path, uint64_t size, uint32_t max_queue_depth);
  // Seconds to move `n` bytes between `buf` and the start of the file with requests of
  // `request` bytes and `depth` in flight; negative on error (message on stderr).
  double run(bool write, std::byte* buf, uint64_t n, uint32_t depth, uint32_t request);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  io_uring ring_{};
  bool ring_ok_ = false;
  uint32_t max_depth_ = 0;
};

// Bytes per second of fio doing `n` bytes of sequential O_DIRECT `write`s or reads on `path`
// (an existing file of at least n bytes); 0 when fio is missing or fails (said on stderr once).
double fio_bandwidth(const std::string& path, bool write, uint64_t n, uint32_t depth, uint32_t request,
                     const std::string& engine);

struct RawCandidate {
  std::string name;  // "io_uring qd32 bs1M", "fio libaio qd32 bs1M"
  bool fio = false;
  std::string engine;  // fio's ioengine
  uint32_t depth = 0, request = 0;
  std::vector<double> write_bw, read_bw;  // bytes/s, one per sample
};

class RawCeiling {
 public:
  // quick: tier-bench's own loop at queue depth 32 and 1 MiB requests, and fio io_uring.
  RawCeiling(RawFile& file, bool quick);
  // Writes then reads `n` bytes with every candidate once; false on error.
  bool sample(std::byte* src, std::byte* dst, uint64_t n);
  // The candidate with the highest median bandwidth; bw 0 before any sample.
  struct Best {
    double bw = 0;  // bytes/s, median over samples
    std::string name;
  };
  Best best(bool write) const;
  void clear();

 private:
  RawFile& file_;
  std::vector<RawCandidate> candidates_;
};

}  // namespace tier::bench
