// Engine: the NVMe tier as the daemon drives it.
//
// open() sets up every configured directory: its data files (ExtentStore), a backend chosen
// per directory (io_uring with O_DIRECT when the kernel and filesystem allow it, else the
// pread/pwrite thread pool, with a log line saying why), and an IoQueue over it. spill() writes a
// tensor's bytes to newly allocated extents, computing one XXH3 checksum per extent; fetch()
// reads them back and verifies every checksum: a mismatch fails the fetch with kCorruption and
// the destination's contents must then not be used (the bytes are never presented as data).
//
// Driving: the engine is single-threaded. The daemon polls event_fd() (readable when any
// directory has completions or a callback is pending) and calls poll() when it is readable;
// callbacks run only from poll()/wait()/drain(), never from inside spill()/fetch(), exactly once
// each, and may start new operations. Buffers passed to spill()/fetch() must stay valid and
// untouched until their callback runs. The destructor drains all I/O in flight.
//
// Alignment: O_DIRECT wants 4 KiB-aligned memory and lengths. Buffers that are aligned (the
// RAM tier's tensor offsets are) go straight to the device; an unaligned last request, or every
// request of an unaligned buffer, goes through a bounce buffer of at most request_size (a memcpy).
//
// Durability: a spill's callback runs only once its copy is durable: every write completed,
// then an fdatasync of each data file it wrote completed after those writes (group commit:
// see Engine::start_sync; one sync per file in flight, shared by every spill whose writes
// finished meanwhile). A replaced copy is freed only then. A failed sync fails the spill
// (kIo "fdatasync <file>: ..."), frees its extents and keeps the replaced copy. Callers may
// therefore journal the location the callback hands them as surviving a power loss.
//
// Checksums run beside the I/O on a small HashPool: a spill submits its writes at once and hashes
// its extents (at most max_extent each) on the workers meanwhile; a fetch verifies each extent
// on a worker as soon as its last chunk lands. The loop thread never hashes (with hash_threads
// = 0 it does, inline).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "nvme/extent_store.hpp"
#include "nvme/hash_pool.hpp"
#include "nvme/io_backend.hpp"
#include "nvme/io_queue.hpp"
#include "nvme/location.hpp"

namespace tier::nvme {

enum class BackendChoice : uint8_t { kAuto = 0, kUring = 1, kPread = 2 };

// Wraps a directory's backend (e.g. in a FaultBackend); see EngineOptions::wrap_backend.
using WrapBackend = std::function<std::unique_ptr<IoBackend>(uint16_t dir, std::unique_ptr<IoBackend>)>;

// Test hook for engines that code under test opens itself (the daemon's NvmeTier): while
// set, Engine::open wraps each directory's backend with it unless the options give their own
// wrap_backend. Process-wide and not synchronized: set it before the open, clear it (empty)
// when done.
void set_default_wrap_backend(WrapBackend wrap);

struct EngineOptions {
  std::vector<DirConfig> dirs;
  uint64_t file_size = uint64_t{1} << 30;    // each preallocated data file
  uint64_t stripe_unit = uint64_t{8} << 20;  // tensors larger than this are striped across dirs
  uint32_t queue_depth = 32;                 // per directory
  uint32_t request_size = 1u << 20;          // bytes per I/O request
  uint32_t threads = 4;                      // pread backend workers per directory
  uint32_t hash_threads = 2;                 // checksum workers; 0 = hash on the caller's thread
  uint64_t max_extent = uint64_t{8} << 20;   // longest extent: the checksum granule
  BackendChoice backend = BackendChoice::kAuto;
  bool format = false;  // delete existing data files at open
  // Write each new data file once (zeros) before use, one file ahead, while the engine is
  // idle, so spills never convert unwritten extents (O_DIRECT directories; file_preparer.hpp).
  bool prepare_files = true;
  // Write-behind flush: once this many bytes of spill writes to one data file have completed
  // since its last fdatasync was issued, the engine issues one more on its own, while the spill
  // goes on. A device with a volatile write cache (an NVMe drive without power-loss protection,
  // a virtio disk over the host's page cache) then persists a long spill as it streams, and the
  // fdatasync the spill waits for at its end finds only the tail to write back, not the whole
  // burst. 0: only the syncs spills wait for (group commit).
  uint64_t flush_behind_bytes = uint64_t{64} << 20;
  // Test hook: wraps each directory's backend (e.g. in a FaultBackend). May be empty.
  WrapBackend wrap_backend;
};

struct DirStats {
  std::string path;
  int numa_node = -1;
  std::string backend;  // "io_uring" or "pread" (tierctl status shows it)
  bool direct_io = false, registered_buffers = false;
  uint64_t capacity = 0, used = 0, file_bytes = 0;
  uint64_t bytes_read = 0, bytes_written = 0;  // device bytes, padding included
  uint64_t syncs = 0;                          // fdatasyncs of data files completed (shared by spills)
  uint64_t prepared_bytes = 0;                 // zeros written to prepare new data files
  uint64_t requests = 0, short_retries = 0, eagain_retries = 0;
  uint64_t in_flight = 0;  // requests in flight now
  uint32_t queue_depth = 0, request_size = 0;
};

struct EngineStats {
  std::vector<DirStats> dirs;
  uint64_t spills = 0, fetches = 0, spill_bytes = 0, fetch_bytes = 0;
  uint64_t io_errors = 0, checksum_failures = 0;
  uint64_t behind_syncs = 0;  // write-behind fdatasyncs issued (flush_behind_bytes), no spill waiting
  // Seconds during which at least one spill or fetch was in flight. (spill_bytes + fetch_bytes)
  // / busy_s is the bandwidth the tier delivers when busy: what prefetch timing should use.
  double busy_s = 0;
  uint64_t capacity = 0, used = 0;
};

class Engine {
 public:
  using SpillDone = std::function<void(Result<NvmeLocation>)>;
  using FetchDone = std::function<void(Status)>;

  [[nodiscard]] static Result<std::unique_ptr<Engine>> open(EngineOptions o);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers the memory spills and fetches will use (the arenas) as io_uring fixed buffers,
  // best effort (see IoBackend::register_memory). Call with nothing in flight. Returns true
  // when every io_uring directory registered them. The regions must stay mapped until they are
  // replaced by another call (an empty span unregisters): the kernel keeps using the pages it
  // pinned, so I/O to a new mapping at a reused address would go to the old pages.
  bool register_memory(std::span<const MemRegion> regions);

  // Writes `src` to newly allocated extents; on success `done` gets the new location, once it
  // is durable (written and fdatasync'd, see "Durability" above). When `replaces` is given,
  // its extents are freed only after the new copy is durable; on failure
  // the new extents are freed and `replaces` stays intact (nothing already stored is lost).
  // Errors: kResourceExhausted (tier full / ENOSPC), kIo (device error, naming file and offset).
  void spill(uint64_t tensor_id, std::span<const std::byte> src, SpillDone done,
             const NvmeLocation* replaces = nullptr);
  // Reads `loc` into `dst` (dst.size() == loc.size) and verifies each extent's checksum.
  // Errors: kCorruption ("checksum mismatch in <file> at offset N"), kIo, kInvalidArgument.
  void fetch(const NvmeLocation& loc, std::span<std::byte> dst, FetchDone done);
  // Returns the extents to free space. The location must not be in use by a fetch.
  [[nodiscard]] Status free(const NvmeLocation& loc);
  // Marks a recorded location's extents used (rebuilding state after a restart).
  [[nodiscard]] Status adopt(const NvmeLocation& loc);

  // Readable when poll() has work; stays valid for the engine's lifetime.
  int event_fd() const noexcept { return epfd_; }
  size_t poll();
  // Blocks until at least one callback ran (returns at once when nothing is pending).
  void wait();
  void drain();
  // Operations whose callback has not run yet.
  size_t pending() const noexcept { return ops_.size() + ready_.size(); }
  // Blocks until no data file is being prepared (a fresh tier has its first file ready).
  void wait_prepared() { store_->wait_prepared(); }

  EngineStats stats() const;
  // Bytes per second moved while busy (see EngineStats::busy_s); 0 before any I/O.
  double measured_bandwidth() const;
  size_t dirs() const noexcept { return store_->dirs(); }
  std::string file_path(const Extent& e) const { return store_->dir(e.dir).file_path(e.file); }
  const EngineOptions& options() const noexcept { return opts_; }

 private:
  struct Dir {
    std::unique_ptr<IoQueue> queue;
    bool direct = false;
    bool registered = false;
  };
  struct Op;

  Engine() = default;
  void defer(std::function<void()> fn);
  void start_extent_io(uint64_t op_id, size_t ext, std::byte* base, bool write);
  void io_done(uint64_t op_id, size_t ext, size_t chunk, int64_t result);
  void hash_done(uint64_t tag, uint64_t hash);
  void hash_extent(uint64_t op_id, size_t ext);
  void signal_if_ready();
  void mark_busy(bool busy);    // ops_ became non-empty (true) or empty (false)
  void settle(uint64_t op_id);  // an op's I/O and hashes are done: sync a spill, else finish
  void start_sync(uint64_t op_id);
  void issue_syncs();
  void note_written(const Extent& e, uint64_t bytes);  // a spill's write completed: write-behind
  void sync_done(uint64_t key, int64_t result);
  void finish(uint64_t op_id);

  // Group commit state of one data file; key = dir << 32 | file.
  struct FileSync {
    bool in_flight = false;
    std::vector<uint64_t> waiting;  // spills whose writes to the file completed: the next sync
    std::vector<uint64_t> covered;  // spills the sync in flight covers
    uint64_t unsynced = 0;          // bytes of writes completed since the last sync was issued
  };
  bool behind_due(const FileSync& f) const;  // flush_behind_bytes written since its last sync
  // syncs_' key of the data file an extent lies in.
  static uint64_t sync_key(const Extent& e) { return (uint64_t{e.dir} << 32) | e.file; }

  EngineOptions opts_;
  std::unique_ptr<ExtentStore> store_;
  std::vector<Dir> dirs_;
  std::unique_ptr<HashPool> hasher_;
  std::vector<HashPool::Result> hashed_;
  int epfd_ = -1, efd_ = -1;
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops_;
  uint64_t next_op_ = 1;
  std::vector<std::function<void()>> ready_;  // callbacks to run at the end of poll()
  std::unordered_map<uint64_t, FileSync> syncs_;
  std::vector<uint64_t> sync_due_;  // files with waiting spills, maybe without a sync in flight
  EngineStats counters_;
  double busy_since_ = 0;  // when ops_ last became non-empty
};

}  // namespace tier::nvme
