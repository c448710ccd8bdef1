#include "nvme_raw.hpp"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "bench_common.hpp"

namespace tier::bench {
namespace {

bool err(const std::string& what, int e) {
  std::fprintf(stderr, "tier-bench nvme: %s: %s\n", what.c_str(), std::strerror(e));
  return false;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string mib_text(uint32_t bytes) { return std::to_string(bytes >> 20) + "M"; }

}  // namespace

RawFile::~RawFile() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

bool RawFile::open(const std::string& path, uint64_t size, uint32_t max_queue_depth) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0) return err("open " + path, errno);
  if (::fallocate(fd_, 0, 0, static_cast<off_t>(size)) != 0) return err("fallocate " + path, errno);
  int rc = io_uring_queue_init(max_queue_depth, &ring_, 0);
  if (rc < 0) return err("io_uring_queue_init", -rc);
  ring_ok_ = true;
  max_depth_ = max_queue_depth;
  auto* buf = static_cast<std::byte*>(std::aligned_alloc(4096, 8u << 20));
  if (buf == nullptr) return err("allocate", ENOMEM);
  std::memset(buf, 0, 8u << 20);
  bool ok = true;
  for (uint64_t pos = 0; pos < size && ok; pos += 8u << 20)
    ok = ::pwrite(fd_, buf, std::min<uint64_t>(8u << 20, size - pos), static_cast<off_t>(pos)) > 0;
  std::free(buf);
  if (!ok) return err("write " + path, errno);
  return ::fdatasync(fd_) == 0 || err("fdatasync " + path, errno);
}

double RawFile::run(bool write, std::byte* buf, uint64_t n, uint32_t depth, uint32_t request) {
  depth = std::min(depth, max_depth_);
  double t0 = seconds_now();
  uint64_t next = 0, done = 0;
  unsigned inflight = 0;
  while (done < n) {
    while (inflight < depth && next < n) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      auto len = static_cast<unsigned>(std::min<uint64_t>(request, n - next));
      if (write) io_uring_prep_write(sqe, fd_, buf + next, len, next);
      else io_uring_prep_read(sqe, fd_, buf + next, len, next);
      io_uring_sqe_set_data64(sqe, len);
      next += len;
      ++inflight;
    }
    io_uring_submit(&ring_);
    io_uring_cqe* cqe;
    int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc < 0) return err("io_uring_wait_cqe", -rc) ? -1 : -1;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      if (cqe->res != static_cast<int>(cqe->user_data)) {
        err("raw O_DIRECT transfer", cqe->res < 0 ? -cqe->res : EIO);
        return -1;
      }
      done += cqe->user_data;
      ++seen;
    }
    io_uring_cq_advance(&ring_, seen);
    inflight -= seen;
  }
  return seconds_now() - t0;
}

double fio_bandwidth(const std::string& path, bool write, uint64_t n, uint32_t depth, uint32_t request,
                     const std::string& engine) {
  static bool warned = false;
  std::string cmd = "fio --name=raw --filename=" + path + (write ? " --rw=write" : " --rw=read") +
                    " --bs=" + std::to_string(request) + " --iodepth=" + std::to_string(depth) +
                    " --ioengine=" + engine + " --direct=1 --offset=0 --size=" + std::to_string(n) +
                    " --minimal 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  if (p != nullptr) {
    char chunk[4096];
    size_t got;
    while ((got = std::fread(chunk, 1, sizeof chunk, p)) > 0) out.append(chunk, got);
    if (::pclose(p) != 0) out = "exit status: " + out;
  }
  // Terse output v3: field 7 is the read bandwidth, field 48 the write bandwidth, in KiB/s.
  std::vector<std::string> fields;
  for (size_t a = 0, b; a <= out.size(); a = b + 1) {
    b = out.find(';', a);
    if (b == std::string::npos) b = out.size();
    fields.push_back(out.substr(a, b - a));
  }
  size_t idx = write ? 47 : 6;
  double kib = fields.size() > idx && fields[0] == "3" ? std::strtod(fields[idx].c_str(), nullptr) : 0;
  if (kib <= 0 && !warned) {
    warned = true;
    std::fprintf(stderr, "tier-bench nvme: fio gave no figure (%s): %s\n", cmd.c_str(),
                 out.substr(0, 300).c_str());
  }
  return kib * 1024;
}

RawCeiling::RawCeiling(RawFile& file, bool quick) : file_(file) {
  constexpr uint32_t M = 1u << 20;
  auto own = [&](uint32_t qd, uint32_t bs) {
    RawCandidate c;
    c.name = "io_uring qd" + std::to_string(qd) + " bs" + mib_text(bs);
    c.depth = qd;
    c.request = bs;
    candidates_.push_back(c);
  };
  auto fio = [&](const char* engine, uint32_t qd, uint32_t bs) {
    RawCandidate c;
    c.name = std::string("fio ") + engine + " qd" + std::to_string(qd) + " bs" + mib_text(bs);
    c.fio = true;
    c.engine = engine;
    c.depth = qd;
    c.request = bs;
    candidates_.push_back(c);
  };
  own(32, M);
  if (!quick) {
    own(64, M);
    own(8, 4 * M);
    own(4, 8 * M);
  }
  fio("io_uring", 32, M);
  if (!quick) fio("libaio", 32, M);
}

bool RawCeiling::sample(std::byte* src, std::byte* dst, uint64_t n) {
  for (bool write : {true, false}) {
    for (RawCandidate& c : candidates_) {
      double bw;
      if (c.fio) {
        bw = fio_bandwidth(file_.path(), write, n, c.depth, c.request, c.engine);
        if (bw <= 0) continue;  // fio missing or failing: the other candidates still count
      } else {
        double s = file_.run(write, write ? src : dst, n, c.depth, c.request);
        if (s < 0) return false;
        bw = static_cast<double>(n) / s;
      }
      (write ? c.write_bw : c.read_bw).push_back(bw);
    }
  }
  return true;
}

RawCeiling::Best RawCeiling::best(bool write) const {
  Best b;
  for (const RawCandidate& c : candidates_) {
    const auto& v = write ? c.write_bw : c.read_bw;
    if (v.empty()) continue;
    double m = median(v);
    if (m > b.bw) b = {m, c.name};
  }
  return b;
}

void RawCeiling::clear() {
  for (RawCandidate& c : candidates_) {
    c.write_bw.clear();
    c.read_bw.clear();
  }
}

}  // namespace tier::bench
