// Writes the seed corpus of every fuzz target: a few small, valid inputs per target.
//   fuzz_gen_corpus DIR     (DIR = fuzz/corpus in the source tree)
// Deterministic, so rerunning it after a format change gives a reviewable diff.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "journal/manifest.hpp"
#include "journal/reader.hpp"
#include "fuzz/request_input.hpp"
#include "wire/messages.hpp"

using namespace tier;
namespace fs = std::filesystem;

namespace {

fs::path g_root;

void put(const std::string& target, const std::string& name, const std::vector<std::byte>& b) {
  fs::create_directories(g_root / target);
  std::ofstream out(g_root / target / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void put_text(const std::string& target, const std::string& name, const std::string& s) {
  std::vector<std::byte> b(s.size());
  for (size_t i = 0; i < s.size(); ++i) b[i] = std::byte(s[i]);
  put(target, name, b);
}

template <class T> std::vector<std::byte> req(wire::MsgType t, const T& msg, uint32_t id = 1) {
  std::vector<std::byte> out;
  if (!wire::encode(static_cast<uint16_t>(t), id, msg, out).is_ok()) std::abort();
  return out;
}
template <class T>
std::vector<std::byte> rep(wire::MsgType t, const Status& st, const T& body, uint32_t id = 1) {
  std::vector<std::byte> out;
  if (!wire::encode_reply(static_cast<uint16_t>(t), id, st, body, out).is_ok()) std::abort();
  return out;
}

void wire_corpus() {
  using namespace tier::wire;
  const std::string t = "fuzz_wire";
  put(t, "hello", req(MsgType::kHello, HelloReq{kVersion, 1234, 0, "rank0"}));
  put(t, "pool_create", req(MsgType::kPoolCreate, PoolCreateReq{"job-a", 1 << 30, 0, true}));
  put(t, "pool_open", req(MsgType::kPoolOpen, PoolNameReq{"job-a"}));
  put(t, "pool_list", req(MsgType::kPoolList, Empty{}));
  put(t, "tensor_create",
      req(MsgType::kTensorCreate, TensorCreateReq{"job-a", "layer.0.w", 4096, 3, {32, 64}, 2, 0, false}));
  put(t, "tensor_open", req(MsgType::kTensorOpen, TensorRefReq{"job-a", "layer.0.w"}));
  put(t, "tensor_list", req(MsgType::kTensorList, TensorListReq{"job-a", 5, 100}));
  put(t, "lease", req(MsgType::kLease, LeaseReq{2, 100, {1, 2, 3}}));
  put(t, "lease_overwrite", req(MsgType::kLease, LeaseReq{3, 0, {1, 2}}));
  put(t, "release", req(MsgType::kRelease, ReleaseReq{{7, 8}}));
  put(t, "lease_reclaim", req(MsgType::kLeaseReclaim, LeaseReclaimReq{2, (1ull << 32) | 5}));
  put(t, "map_arena", req(MsgType::kMapArena, MapArenaReq{3}));
  put(t, "arena_pin", req(MsgType::kArenaPin, ArenaPinReq{1 << 16, 4096, 1 << 20, true}));
  put(t, "prefetch", req(MsgType::kPrefetch, TensorIdsReq{"job-a", {1, 2}}));
  put(t, "discard", req(MsgType::kDiscard, TensorIdsReq{"job-a", {2, 3}}));
  put(t, "plan_set", req(MsgType::kPlanSet, PlanSetReq{"job-a", {1, 2, 1, 3}, 1 << 20, {0, 1, 0, 0}}));
  put(t, "snapshot", req(MsgType::kSnapshot, PoolNameReq{"job-a"}));
  put(t, "snapshot_take", req(MsgType::kSnapshotTake, SnapshotTakeReq{"job-a", 600, 2}));
  put(t, "snapshot_list", req(MsgType::kSnapshotList, PoolNameReq{"job-a"}));
  put(t, "snapshot_restore", req(MsgType::kSnapshotRestore, SnapshotRestoreReq{"job-a", 3}));
  put(t, "rep_error", rep(MsgType::kPoolOpen, Status(Code::kNotFound, "no pool named 'x'"), Empty{}));
  put(t, "rep_pool",
      rep(MsgType::kPoolOpen, Status::ok(), PoolInfoW{1, "job-a", 1000, 1 << 30, 0, 4096, 0, 1}));
  put(t, "rep_lease",
      rep(MsgType::kLease, Status::ok(),
          LeaseRep{{LeaseGrant{1, 2, 3, 4096, 4096}, LeaseGrant{2, 3, 3, 8192, 64}}}));
  put(t, "rep_tensors",
      rep(MsgType::kTensorList, Status::ok(),
          TensorListRep{{TensorInfoW{1, "w", 4096, 3, {64, 32}, 0, 1, false, 1, false}}, true}));
  StatusRep st{"0.1.0",
               1234,
               2,
               1,
               5,
               {NodeTierW{0, 1 << 30, 4096, 0, 1}},
               {NvmeTierW{"/nvme", 0, "io_uring", 1ull << 40, 0}},
               1,
               2,
               3,
               4,
               5,
               6,
               7,
               8,
               9};
  put(t, "rep_status", rep(MsgType::kStatus, Status::ok(), st));
  put(t, "rep_topo",
      rep(MsgType::kTopo, Status::ok(),
          TopoRep{"hwloc:this system",
                  {TopoNodeW{0, 1ull << 34, "0-1"}},
                  {TopoDevW{0, "A100", "0000:07:00.0", 0}},
                  {}}));
}

void journal_corpus() {
  using namespace tier::journal;
  const std::string t = "fuzz_journal";
  std::vector<Record> all = {
      Watermarks{2, 10, 1, 2, 1},
      PoolCreated{1, "job", 1000, 1000, 0, 1 << 30, 0},
      ArenaCreated{1, 65536, 0, "tierd-1a2b3c4d-p1-n0", 1 << 30},
      TensorCreated{1, 5, "w", 4096, 3, {32, 32}, 0, 65536, 0, 4096},
      NvmeCopyWritten{5, 1, {Extent{"/nvme", "d.0", 0, 4096, 0x1234}}},
      TensorRamDropped{5},
      TensorRamPlaced{5, 0, 65536, 8192, 4096},
      NvmeCopyDropped{5, 1},
      WriteLeaseHeld{5, (1ull << 32) | 3, 1000, 4242, 987654, 4026531836ull},
      WriteLeaseEnded{5},
      SnapshotBegun{1, 1, "/snap/1"},
      SnapshotTagged{1, 1, 12},
      SnapshotDurable{1, 1, "/snap/1", 4096},
      PoolRecovered{1, 1, 0},
      PoolRestored{1, 1},
      SnapshotDropped{1, 1},
      TensorDeleted{1, 5},
      PoolDropped{1},
  };
  std::vector<std::byte> j;
  encode_file_header(kJournalMagic, 1, 0, j);
  for (size_t i = 0; i < all.size(); ++i)
    if (!encode_record(all[i], i + 1, j).is_ok()) std::abort();
  put(t, "every_record", j);
  // The synthesized form (fuzz_journal.cpp): byte 0 odd, then (u16 type, u16 length, payload).
  std::vector<std::byte> syn{std::byte{1}};
  for (const Record& r : all) {
    std::vector<std::byte> payload;
    encode_payload(r, payload);
    uint16_t hdr[2] = {static_cast<uint16_t>(record_type(r)), static_cast<uint16_t>(payload.size())};
    const auto* hb = reinterpret_cast<const std::byte*>(hdr);
    syn.insert(syn.end(), hb, hb + sizeof hdr);
    syn.insert(syn.end(), payload.begin(), payload.end());
  }
  put(t, "synthesized_records", syn);
  auto torn = j;
  torn.resize(torn.size() - 5);
  put(t, "torn_tail", torn);
  std::vector<std::byte> c;
  encode_file_header(kJournalMagic, 100, 1, c);
  for (size_t i = 0; i < 3; ++i)
    if (!encode_record(all[i], 100 + i, c).is_ok()) std::abort();
  put(t, "compacted", c);
  std::vector<std::byte> empty;
  encode_file_header(kJournalMagic, 1, 0, empty);
  put(t, "header_only", empty);

  // A manifest, written through the real writer into the corpus directory.
  fs::create_directories(g_root / t);
  std::vector<Record> body = {PoolCreated{1, "job", 1000, 1000, 0, 1 << 30, 0},
                              TensorCreated{1, 5, "w", 4096, 3, {32, 32}, 0, 65536, 0, 4096},
                              NvmeCopyWritten{5, 1, {Extent{"/snap", "s1.data", 0, 4096, 77}}}};
  if (!write_manifest((g_root / t / "manifest").string(), ManifestBegin{1, 1, 1700000000000ull}, body)
           .is_ok())
    std::abort();
}

void config_corpus() {
  const std::string t = "fuzz_config";
  put_text(t, "minimal", "ram = \"1G\"\n");
  put_text(t, "full",
           "socket = \"/run/tierd/tierd.sock\"\n"
           "state_dir = \"/var/lib/tierd\"\n"
           "ram = \"80%\"\n"
           "pool_quota = \"50%\"\n"
           "nvme_pool_quota = \"100%\"\n"
           "hugepages = \"2M\"\n"
           "alignment = \"2M\"\n"
           "topology = \"synthetic:node:2 core:2 pu:1\"\n"
           "admin_group = \"tier-admin\"\n"
           "watchdog = true\n"
           "status_interval_ms = 5000\n"
           "max_clients = 4096\n"
           "max_leases_per_client = 1048576\n"
           "remove_arenas_on_exit = false\n"
           "ram_dirty_background = 0.25\n"
           "log_level = \"info\"\n"
           "\n[[nvme]]\npath = \"/mnt/nvme0/tier\"\nnuma_node = 0\n"
           "\n[[nvme]]\npath = \"/mnt/nvme1/tier\"\n");
  put_text(t, "bad_key", "rma = \"1G\"\n");
  put_text(t, "bad_size", "ram = \"lots\"\n");
  put_text(t, "types", "ram = 17\nwatchdog = \"yes\"\nnvme = 3\n");
  put_text(t, "hash_threads", "nvme_hash_threads = 8\nnvme_hash_threads = 257\n");
  put_text(t, "flush_behind", "nvme_flush_behind = \"16M\"\nnvme_flush_behind = \"5%\"\n");
  put_text(t, "nvme_twice",
           "nvme = [ { path = \"/mnt/nvme0/tier\" }, { path = \"/mnt/nvme0//tier/.\", numa_node = 1 } ]\n");
  std::error_code ec;
  fs::path example = fs::path(g_root).parent_path().parent_path() / "daemon" / "tierd.toml.example";
  if (fs::exists(example, ec))
    fs::copy_file(example, g_root / t / "tierd.toml.example", fs::copy_options::overwrite_existing, ec);
}

void request_corpus() {
  using namespace tier::wire;
  const std::string t = "fuzz_request";
  auto seq = [](uint8_t uid_sel, const std::vector<std::vector<std::byte>>& msgs) {
    return fuzzreq::frame(uid_sel, msgs);
  };
  auto hello = req(MsgType::kHello, HelloReq{kVersion, 1, 0, "fuzz"}, 1);
  auto pool = req(MsgType::kPoolCreate, PoolCreateReq{"p", 64 << 20, 0, false}, 2);
  auto tensor = req(MsgType::kTensorCreate, TensorCreateReq{"p", "w", 8192, 1, {2048}, 0, -1, false}, 3);
  auto tensor2 =
      req(MsgType::kTensorCreate, TensorCreateReq{"p", "b", 4 << 20, 3, {1024, 2048}, 1, 0, true}, 4);
  put(t, "hello_only", seq(0, {hello}));
  put(t, "create",
      seq(0, {hello, pool, tensor, tensor2, req(MsgType::kTensorList, TensorListReq{"p", 0, 0}, 5),
              req(MsgType::kPoolList, Empty{}, 6)}));
  put(t, "lease_release",
      seq(1, {hello, pool, tensor, req(MsgType::kLease, LeaseReq{2, 0, {1}}, 4),
              req(MsgType::kLease, LeaseReq{1, 0, {1}}, 5), req(MsgType::kRelease, ReleaseReq{{1}}, 6),
              req(MsgType::kLease, LeaseReq{1, 0, {1, 1}}, 7), req(MsgType::kMapArena, MapArenaReq{1}, 8)}));
  // A reclaim with no lease to take back (no restart), then one naming a live lease of B's.
  put(t, "lease_reclaim",
      fuzzreq::frame(0x5,
                     {hello, hello, pool, tensor, req(MsgType::kLease, LeaseReq{2, 0, {1}}, 4),
                      req(MsgType::kLeaseReclaim, LeaseReclaimReq{1, 1}, 5),
                      req(MsgType::kLeaseReclaim, LeaseReclaimReq{1, 0}, 6)},
                     {false, true, false, false, false, true, false}));
  put(t, "delete_drop",
      seq(0, {hello, pool, tensor, req(MsgType::kTensorOpen, TensorRefReq{"p", "w"}, 4),
              req(MsgType::kTensorDelete, TensorRefReq{"p", "w"}, 5),
              req(MsgType::kPoolDrop, PoolNameReq{"p"}, 6)}));
  put(t, "inspect",
      seq(2, {hello, req(MsgType::kStatus, Empty{}, 2), req(MsgType::kTopo, Empty{}, 3),
              req(MsgType::kMetrics, Empty{}, 4), req(MsgType::kPoolOpen, PoolNameReq{"nope"}, 5)}));
  put(t, "no_hello", seq(0, {pool, tensor}));
  // Two sessions: B (uid 1000) waits for a lease A holds, then tries A's pool as another uid.
  put(t, "two_sessions",
      fuzzreq::frame(
          0x4 /* A root, B uid 1000 */,
          {hello, hello, pool, tensor, req(MsgType::kLease, LeaseReq{2, 0, {1}}, 4),
           req(MsgType::kLease, LeaseReq{1, 1000, {1}}, 5), req(MsgType::kRelease, ReleaseReq{{1}}, 6),
           req(MsgType::kPoolOpen, PoolNameReq{"p"}, 7), req(MsgType::kPoolDrop, PoolNameReq{"p"}, 8)},
          {false, true, false, false, false, true, false, true, true}));
  put(t, "two_sessions_same_uid",
      fuzzreq::frame(
          0x5 /* both uid 1000 */,
          {hello, hello, pool, tensor, req(MsgType::kLease, LeaseReq{1, 0, {1}}, 4),
           req(MsgType::kLease, LeaseReq{1, 0, {1}}, 5), req(MsgType::kLease, LeaseReq{2, -1, {1}}, 6),
           req(MsgType::kTensorDelete, TensorRefReq{"p", "w"}, 7)},
          {false, true, false, false, false, true, true, false}));
  // Names with control characters and malformed UTF-8, sizes no pool can hold (2^63, 2^64-1).
  auto named = [](std::string name, uint64_t size, uint32_t id) {
    return req(MsgType::kTensorCreate, TensorCreateReq{"p", std::move(name), size, 0, {}, 0, -1, false}, id);
  };
  put(t, "names_and_sizes",
      seq(0, {hello, pool, named("a\nb", 4096, 3), named("\x1b[31m", 4096, 4), named("c1\xc2\x85", 4096, 5),
              named("bad\xff\xc0\xaf", 4096, 6), named("ok \xc3\xbc", 4096, 7),
              named("huge", uint64_t{1} << 63, 8), named("max", ~uint64_t{0}, 9),
              req(MsgType::kPoolCreate, PoolCreateReq{"p\x1b", 0, 0, false}, 10)}));
  put(t, "nvme",
      seq(0,
          {hello, pool, tensor, req(MsgType::kEvict, TensorIdsReq{"p", {1}}, 4),
           req(MsgType::kPrefetch, TensorIdsReq{"p", {1}}, 5),
           req(MsgType::kPlanSet, PlanSetReq{"p", {1, 1}, 0, {}}, 6),
           req(MsgType::kSnapshot, PoolNameReq{"p"}, 7), req(MsgType::kDiscard, TensorIdsReq{"p", {1}}, 8)}));
  put(t, "snapshot_restore",
      seq(0, {hello, pool, tensor, req(MsgType::kSnapshotTake, SnapshotTakeReq{"p", 5, 2}, 4),
              req(MsgType::kSnapshotList, PoolNameReq{"p"}, 5),
              req(MsgType::kSnapshotRestore, SnapshotRestoreReq{"p", 1}, 6),
              req(MsgType::kSnapshotRestore, SnapshotRestoreReq{"p", 99}, 7)}));
  // Pin the first pool's arena (pool 1, node 0) around an eviction, unpin, unpin again.
  put(t, "arena_pin",
      seq(0, {hello, pool, tensor, req(MsgType::kLease, LeaseReq{1, 0, {1}}, 4),
              req(MsgType::kMapArena, MapArenaReq{1 << 16}, 5),
              req(MsgType::kArenaPin, ArenaPinReq{1 << 16, 0, 1 << 20, true}, 6),
              req(MsgType::kRelease, ReleaseReq{{1}}, 7), req(MsgType::kEvict, TensorIdsReq{"p", {1}}, 8),
              req(MsgType::kArenaPin, ArenaPinReq{1 << 16, 0, 1 << 20, false}, 9),
              req(MsgType::kArenaPin, ArenaPinReq{1 << 16, 0, 1 << 20, false}, 10),
              req(MsgType::kArenaPin, ArenaPinReq{1 << 16, ~0ull, 2, true}, 11)}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  g_root = fs::absolute(argv[1]);
  wire_corpus();
  journal_corpus();
  config_corpus();
  request_corpus();
  std::printf("corpus written to %s\n", g_root.c_str());
  return 0;
}
