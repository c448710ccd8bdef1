// journal_bench [DIR]: append throughput per fsync policy, replay and compaction speed, each
// beside its baseline (raw pwrite, + fdatasync where the policy syncs, of the same bytes).
// Prints the project's JSON lines. Not a test: run by hand, figures go to docs/journal.md.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "journal/journal.hpp"

using namespace tier;
using namespace tier::journal;
using Clock = std::chrono::steady_clock;

namespace {

Record sample(int i) {
  return TensorCreated{1,       uint64_t(i), "layer." + std::to_string(i) + ".weight",
                       1 << 20, 3,           {1024, 512},
                       0,       1,           uint64_t(i) << 20,
                       1 << 20};
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void line(const std::string& name, uint64_t bytes, double value, double baseline) {
  std::printf(
      "{\"name\":\"%s\",\"bytes\":%llu,\"value\":%.0f,\"unit\":\"records/s\","
      "\"baseline\":%.0f,\"ratio\":%.3f}\n",
      name.c_str(), (unsigned long long)bytes, value, baseline, value / baseline);
}

// Raw baseline: the same number of writes of `rec_bytes`, fdatasync every `sync_every` (0: never).
double raw_rate(const std::string& dir, int n, size_t rec_bytes, int sync_every) {
  std::string p = dir + "/raw";
  int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  std::vector<char> buf(rec_bytes, 'x');
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (::pwrite(fd, buf.data(), buf.size(), off_t(i) * off_t(rec_bytes)) < 0) return 0;
    if (sync_every && (i + 1) % sync_every == 0) (void)::fdatasync(fd);
  }
  if (sync_every) (void)::fdatasync(fd);
  double r = n / since(t0);
  ::close(fd);
  ::unlink(p.c_str());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "/var/tmp/tier-journal-bench";
  std::vector<std::byte> one;
  (void)encode_record(sample(1), 1, one);
  const size_t rec_bytes = one.size();
  struct Case {
    FsyncPolicy p;
    int n;
    int sync_every;
  };
  for (Case c : {Case{FsyncPolicy::kAlways, 1000, 1}, Case{FsyncPolicy::kBatch, 100000, 64},
                 Case{FsyncPolicy::kNever, 100000, 0}}) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto j = Journal::open(dir, {.fsync = c.p}, {});
    if (!j) {
      std::fprintf(stderr, "%s\n", j.error().to_string().c_str());
      return 1;
    }
    auto t0 = Clock::now();
    for (int i = 0; i < c.n; ++i) {
      if (!(*j)->append(sample(i))) return 1;
      if (c.p == FsyncPolicy::kBatch && (i + 1) % c.sync_every == 0 && !(*j)->sync()) return 1;
    }
    if (!(*j)->sync()) return 1;
    double rate = c.n / since(t0);
    line(std::string("journal_append_") + std::string(fsync_policy_name(c.p)), rec_bytes, rate,
         raw_rate(dir, c.n, rec_bytes, c.sync_every));
    if (c.p != FsyncPolicy::kNever) continue;
    j->reset();
    uint64_t count = 0;
    t0 = Clock::now();
    auto j2 = Journal::open(dir, {}, [&](const Record&, uint64_t, size_t) {
      ++count;
      return Status::ok();
    });
    if (!j2) return 1;
    double replay = count / since(t0);
    // Baseline: reading the same file.
    t0 = Clock::now();
    auto data = inspect_journal((*j2)->path(), {});
    (void)data;
    line("journal_replay", (*j2)->size_bytes(), replay, count / since(t0));
    std::vector<Record> live;
    for (int i = 0; i < c.n; i += 2) live.push_back(sample(i));
    t0 = Clock::now();
    if (!(*j2)->compact(live)) return 1;
    double compact = live.size() / since(t0);
    line("journal_compact", (*j2)->size_bytes(), compact,
         raw_rate(dir, int(live.size()), rec_bytes, int(live.size())));
  }
  std::filesystem::remove_all(dir);
  return 0;
}
