// kill -9 of a process appending to the journal with fsync=always: every record it
// acknowledged must be replayed by the next open, over many trials on the same journal.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "journal/journal.hpp"
#include "journal_util.hpp"

using namespace tier;
using namespace tier::journal;
using namespace tier::journal::test;

namespace {

// The record the child appends for tensor id `id`: every third one is large (about 90 KiB) so
// that a kill can land in the middle of writing it.
Record record_for(uint64_t id, bool allow_large = true) {
  if (allow_large && id % 3 == 0) {
    NvmeCopyWritten c{id, id * 7, {}};
    for (uint64_t e = 0; e < 900; ++e)
      c.extents.push_back(Extent{"/nvme/dir" + std::to_string(e % 4), "data." + std::to_string(id), e << 20,
                                 1 << 20, id ^ (e * 0x9E3779B97F4A7C15ull)});
    return c;
  }
  return TensorCreated{
      1, id, "tensor-" + std::to_string(id), id * 4096, 3, {int64_t(id), 8}, 0, 1, id << 12, id * 4096};
}

uint64_t id_of(const Record& r) {
  if (auto* t = std::get_if<TensorCreated>(&r)) return t->tensor_id;
  if (auto* c = std::get_if<NvmeCopyWritten>(&r)) return c->tensor_id;
  return 0;
}

// Child: opens the journal, appends records for ids first_id, first_id + 1, ... and writes each
// acknowledged (seq, id) pair to `ack_fd` after append() returned. Never returns.
[[noreturn]] void child_main(const std::string& dir, uint64_t first_id, int ack_fd) {
  auto j = Journal::open(dir, {.fsync = FsyncPolicy::kAlways}, {});
  if (!j) _exit(3);
  for (uint64_t id = first_id;; ++id) {
    auto seq = (*j)->append(record_for(id));
    if (!seq) _exit(4);
    uint64_t ack[2] = {*seq, id};
    if (::write(ack_fd, ack, sizeof ack) != sizeof ack) _exit(5);
  }
}

// Forks a child that runs `body` with the write end of a pipe (it must not return: it exits
// or is killed); the parent gets the child's pid and the read end.
template <class Body> std::pair<pid_t, int> fork_child(Body body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    body(fds[1]);
    ::_exit(7);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

}  // namespace

TEST_CASE("kill -9 while appending with fsync=always loses no acknowledged record", "[journal][crash]") {
  TempDir dir;
  std::mt19937_64 rng(std::random_device{}());
  std::map<uint64_t, uint64_t> acked;  // seq -> id, over all trials
  uint64_t next_id = 1;
  uint64_t total_dropped = 0, trials_with_torn_tail = 0, total_recovered = 0;
  const int kTrials = 24;
  for (int trial = 0; trial < kTrials; ++trial) {
    auto [pid, ack_fd] = fork_child([&](int fd) { child_main(dir.path(), next_id, fd); });
    // Let it run until a random number of acks (0..40) arrived, then kill it mid-flight.
    const int want = std::uniform_int_distribution<int>(0, 40)(rng);
    int got = 0;
    auto record_ack = [&](const uint64_t ack[2]) {
      acked[ack[0]] = ack[1];
      next_id = std::max(next_id, ack[1] + 1);
    };
    while (got < want) {
      uint64_t ack[2];
      ssize_t n = ::read(ack_fd, ack, sizeof ack);
      if (n != sizeof ack) break;
      record_ack(ack);
      ++got;
    }
    // A random extra delay of up to 2 ms places the kill at varying points of an append.
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng)));
    ::kill(pid, SIGKILL);
    // Acks written before the kill are still in the pipe: they count too.
    for (;;) {
      uint64_t ack[2];
      ssize_t n = ::read(ack_fd, ack, sizeof ack);
      if (n != sizeof ack) break;
      record_ack(ack);
    }
    ::close(ack_fd);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("child exit status " << status);
    REQUIRE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    // The child may have appended records it never got to acknowledge: ids after the last
    // acked one are unacknowledged, so the next child starts past everything on disk.
    Replayed seen;
    OpenReport rep;
    {
      auto j = Journal::open(dir.path(), {}, seen.visitor(), &rep);
      REQUIRE(j.has_value());
    }
    total_dropped += rep.dropped_tail_bytes;
    if (rep.dropped_tail_bytes > 0) ++trials_with_torn_tail;
    std::map<uint64_t, const Record*> by_seq;
    for (size_t i = 0; i < seen.records.size(); ++i) by_seq[seen.seqs[i]] = &seen.records[i];
    for (auto [seq, id] : acked) {
      INFO("trial " << trial << " acknowledged seq " << seq << " id " << id);
      auto it = by_seq.find(seq);
      REQUIRE(it != by_seq.end());
      REQUIRE(*it->second == record_for(id));
    }
    for (const Record& r : seen.records) next_id = std::max(next_id, id_of(r) + 1);
    total_recovered = seen.records.size();
  }
  std::printf(
      "journal kill -9: %d trials, %zu records acknowledged, %llu recovered, "
      "%llu torn tails truncated (%llu bytes)\n",
      kTrials, acked.size(), static_cast<unsigned long long>(total_recovered),
      static_cast<unsigned long long>(trials_with_torn_tail), static_cast<unsigned long long>(total_dropped));
  CHECK(total_recovered >= acked.size());
}

TEST_CASE("kill -9 during appends and compactions: the journal is the old or the new one",
          "[journal][crash][compaction]") {
  TempDir dir;
  std::mt19937_64 rng(std::random_device{}());
  std::set<uint64_t> acked_ids;
  uint64_t next_id = 1;
  int compactions_seen = 0;
  const int kTrials = 20;
  for (int trial = 0; trial < kTrials; ++trial) {
    auto [pid, ack_fd] = fork_child([&](int ack_out) {
      // Rebuild the live set from the journal, then append small records, compacting every 8
      // with every record seen so far as the live state (so replay content is unchanged).
      std::vector<Record> live;
      auto j =
          Journal::open(dir.path(), {.fsync = FsyncPolicy::kAlways}, [&](const Record& r, uint64_t, size_t) {
            live.push_back(r);
            return Status::ok();
          });
      if (!j) _exit(3);
      for (uint64_t id = next_id;; ++id) {
        Record r = record_for(id, false);
        if (!(*j)->append(r)) _exit(4);
        live.push_back(r);
        if (id % 8 == 0 && !(*j)->compact(live)) _exit(6);
        if (::write(ack_out, &id, sizeof id) != sizeof id) _exit(5);
      }
    });
    const int want = std::uniform_int_distribution<int>(0, 30)(rng);
    int got = 0;
    uint64_t id;
    while (got < want && ::read(ack_fd, &id, sizeof id) == sizeof id) {
      acked_ids.insert(id);
      ++got;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng)));
    ::kill(pid, SIGKILL);
    while (::read(ack_fd, &id, sizeof id) == sizeof id) acked_ids.insert(id);
    ::close(ack_fd);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));

    Replayed seen;
    OpenReport rep;
    {
      auto j = Journal::open(dir.path(), {}, seen.visitor(), &rep);
      REQUIRE(j.has_value());
    }
    if (rep.removed_stale_compaction) ++compactions_seen;
    std::set<uint64_t> present;
    for (const Record& r : seen.records) {
      REQUIRE(r == record_for(id_of(r), false));
      REQUIRE(present.insert(id_of(r)).second);  // no record replayed twice
      next_id = std::max(next_id, id_of(r) + 1);
    }
    for (uint64_t a : acked_ids) {
      INFO("trial " << trial << " acknowledged id " << a);
      REQUIRE(present.count(a) == 1);
    }
  }
  std::printf(
      "journal kill -9 with compaction: %d trials, %zu records acknowledged, all "
      "present; %d kills interrupted a compaction before its rename\n",
      kTrials, acked_ids.size(), compactions_seen);
  CHECK(acked_ids.size() <= next_id);
}

TEST_CASE("a write cut short by the file size limit is undone; the journal stays valid", "[journal][crash]") {
  TempDir dir;
  {
    auto j = Journal::open(dir.path(), {.fsync = FsyncPolicy::kAlways}, {});
    REQUIRE(j.has_value());
    REQUIRE((*j)->append(record_for(1)).has_value());
  }
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // EFBIG after a partial write, the way a full disk (ENOSPC) fails a write midway.
    ::signal(SIGXFSZ, SIG_IGN);
    auto j = Journal::open(dir.path(), {.fsync = FsyncPolicy::kAlways}, {});
    if (!j) _exit(3);
    struct rlimit lim{(*j)->size_bytes() + 100, RLIM_INFINITY};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(4);
    auto big = (*j)->append(record_for(3));  // ~90 KiB: only 100 bytes fit
    if (big.has_value()) _exit(5);
    if (!(*j)->health().is_ok()) _exit(6);                         // undone, not failed
    if (!(*j)->append(TensorDeleted{1, 1}).has_value()) _exit(7);  // 40 bytes: fits
    _exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  Replayed seen;
  OpenReport rep;
  auto j = Journal::open(dir.path(), {}, seen.visitor(), &rep);
  REQUIRE(j.has_value());
  CHECK(rep.dropped_tail_bytes == 0);
  CHECK(seen.records == std::vector<Record>{record_for(1), TensorDeleted{1, 1}});
  CHECK(seen.seqs == std::vector<uint64_t>{1, 2});
}
