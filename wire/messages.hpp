// The control-plane protocol between libtier and tierd.
//
// Transport: a Unix SOCK_SEQPACKET socket; one datagram is one message, at most
// kMaxMessageBytes. A message is a Header followed by `payload_len` payload bytes. Requests
// carry a type from MsgType; the reply carries the same type with kReplyBit set and the same
// request_id, and its payload starts with a ReplyStatus; the reply body follows only when the
// status is ok. Arena file descriptors ride on MapArena replies as SCM_RIGHTS ancillary data.
//
// Compatibility: kVersion is bumped on any change of an existing message's fields. A daemon
// answers a Hello of another version with kProtocol and closes the connection.
#pragma once

// clang-format off: the messages below are a table (fields, then their one-line visit), kept
// one line each so that a field and its place in the encoding are read together.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tier/status.hpp"
#include "tier/types.hpp"
#include "wire/codec.hpp"
#include "base/errors.hpp"

namespace tier::wire {

// --- protocol constants (part of the wire format) ---
inline constexpr uint32_t kMagic = 0x52454954;  // "TIER" read as little-endian bytes
inline constexpr uint16_t kVersion = 2;  // 2: LeaseMode kOverwrite, PlanSetReq.overwrite
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
inline constexpr uint16_t kReplyBit = 0x8000;
inline constexpr uint32_t kMaxBatch = 4096;  // tensors in one lease/release/prefetch request

enum class MsgType : uint16_t {
  kHello = 1,
  kPoolCreate = 2,
  kPoolOpen = 3,
  kPoolList = 4,
  kPoolDrop = 5,
  kTensorCreate = 6,
  kTensorOpen = 7,
  kTensorList = 8,
  kTensorDelete = 9,
  kLease = 10,
  kRelease = 11,
  kMapArena = 12,
  kStatus = 13,
  kTopo = 14,
  kPrefetch = 15,
  kEvict = 16,
  kPlanSet = 17,
  kSnapshot = 18,
  kMetrics = 19,
  kDiscard = 20,  // added within version 2: an older daemon answers it as an unknown type
  kLeaseReclaim = 21,  // added within version 2, likewise
  kArenaPin = 22,  // added within version 2, likewise
  kSnapshotTake = 23,     // added within version 2, likewise: a tagged snapshot, keeping older ones
  kSnapshotList = 24,     // added within version 2, likewise
  kSnapshotRestore = 25,  // added within version 2, likewise
};
inline constexpr uint16_t kMaxMsgType = 25;

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t type = 0;  // MsgType, | kReplyBit on replies
  uint32_t request_id = 0;
  uint32_t payload_len = 0;
};
inline constexpr size_t kHeaderBytes = 16;
static_assert(sizeof(Header) == kHeaderBytes && alignof(Header) == 4, "Header is a wire layout");

struct ReplyStatus {
  uint16_t code = 0;  // tier::Code
  std::string message;
  template <class V> void visit(V& v) { v(code); v(message); }
};

// --- requests and reply bodies. Empty structs are messages without fields. ---

struct HelloReq {
  uint16_t version = kVersion;
  int32_t pid = 0;
  int32_t numa_node = -1;  // the client's current node, for Placement::kAny
  std::string client_name;  // for logs and tierctl status
  template <class V> void visit(V& v) { v(version); v(pid); v(numa_node); v(client_name); }
};
struct HelloRep {
  uint16_t version = kVersion;
  std::string daemon_version;
  uint64_t session_id = 0;
  template <class V> void visit(V& v) { v(version); v(daemon_version); v(session_id); }
};

struct PoolInfoW {
  uint64_t id = 0;
  std::string name;
  uint32_t owner_uid = 0;
  uint64_t ram_quota = 0, nvme_quota = 0, ram_used = 0, nvme_used = 0, tensor_count = 0;
  uint32_t group = UINT32_MAX;  // UINT32_MAX: none
  bool group_read = false;
  template <class V> void visit(V& v) {
    v(id); v(name); v(owner_uid); v(ram_quota); v(nvme_quota); v(ram_used); v(nvme_used);
    v(tensor_count); v(group); v(group_read);
  }
};

struct PoolCreateReq {
  std::string name;
  uint64_t ram_quota = 0, nvme_quota = 0;
  bool exist_ok = false;  // open the pool instead of failing when it exists (same owner only)
  uint32_t group = UINT32_MAX;  // a group that may read the pool (with group_read); UINT32_MAX: none
  bool group_read = false;
  template <class V> void visit(V& v) { v(name); v(ram_quota); v(nvme_quota); v(exist_ok); v(group); v(group_read); }
};
struct PoolNameReq {  // PoolOpen, PoolDrop, TensorList, Snapshot
  std::string name;
  template <class V> void visit(V& v) { v(name); }
};
struct PoolListRep {
  std::vector<PoolInfoW> pools;
  template <class V> void visit(V& v) { v(pools); }
};

struct TensorInfoW {
  uint64_t id = 0;
  std::string name;
  uint64_t size = 0;
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  int32_t numa_node = -1;
  uint8_t tiers = 0;
  bool dirty = false;
  uint32_t readers = 0;
  bool writer = false;
  template <class V> void visit(V& v) {
    v(id); v(name); v(size); v(dtype); v(shape); v(numa_node); v(tiers); v(dirty); v(readers);
    v(writer);
  }
};

struct TensorCreateReq {
  std::string pool;
  std::string name;
  uint64_t size = 0;
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  uint8_t placement_kind = 0;
  int32_t placement_index = -1;
  bool exist_ok = false;  // return the existing tensor when name and size match
  template <class V> void visit(V& v) {
    v(pool); v(name); v(size); v(dtype); v(shape); v(placement_kind); v(placement_index);
    v(exist_ok);
  }
};
struct TensorRefReq {  // TensorOpen, TensorDelete
  std::string pool;
  std::string name;
  template <class V> void visit(V& v) { v(pool); v(name); }
};
struct TensorListReq {
  std::string pool;
  uint64_t after_id = 0;  // paging: only tensors with id > after_id
  uint32_t max = 0;       // 0 = as many as fit in one reply
  template <class V> void visit(V& v) { v(pool); v(after_id); v(max); }
};
struct TensorListRep {
  std::vector<TensorInfoW> tensors;
  bool more = false;  // another page follows after the last id
  template <class V> void visit(V& v) { v(tensors); v(more); }
};

struct LeaseReq {
  uint8_t mode = 1;         // LeaseMode
  int32_t timeout_ms = 0;   // 0 = fail fast with kBusy; < 0 = wait forever; > 0 = wait
  std::vector<uint64_t> tensor_ids;  // all granted or none
  template <class V> void visit(V& v) { v(mode); v(timeout_ms); v(tensor_ids); }
};
struct LeaseGrant {
  uint64_t lease_id = 0;
  uint64_t tensor_id = 0;
  uint64_t arena_id = 0;  // map with MapArena once per connection
  uint64_t offset = 0;    // byte offset of the tensor in the arena
  uint64_t length = 0;
  template <class V> void visit(V& v) { v(lease_id); v(tensor_id); v(arena_id); v(offset); v(length); }
};
struct LeaseRep {
  std::vector<LeaseGrant> grants;  // in request order
  template <class V> void visit(V& v) { v(grants); }
};
struct ReleaseReq {
  std::vector<uint64_t> lease_ids;
  template <class V> void visit(V& v) { v(lease_ids); }
};
// After a daemon restart: take back the write lease `lease_id` (the id the previous daemon
// granted) on `tensor_id`. Reply: a LeaseRep with one grant (a new lease id), or an error when
// the daemon no longer holds that lease for this client (docs/daemon.md, "Leases across a
// restart").
struct LeaseReclaimReq {
  uint64_t tensor_id = 0;
  uint64_t lease_id = 0;
  template <class V> void visit(V& v) { v(tensor_id); v(lease_id); }
};

struct MapArenaReq {
  uint64_t arena_id = 0;
  template <class V> void visit(V& v) { v(arena_id); }
};
struct MapArenaRep {  // the arena's fd rides along as SCM_RIGHTS
  uint64_t arena_id = 0;
  uint64_t size = 0;
  int32_t numa_node = -1;
  template <class V> void visit(V& v) { v(arena_id); v(size); v(numa_node); }
};

// The client pinned (pinned = true) or unpinned bytes [offset, offset+length) of an arena it
// maps, e.g. with cudaHostRegister: a device DMAs to and from those physical pages, so tierd
// must never punch them out of the arena (daemon/tiering/ram/dma_pins.hpp). Pins belong to the connection.
// Reply: Empty.
struct ArenaPinReq {
  uint64_t arena_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool pinned = true;
  template <class V> void visit(V& v) { v(arena_id); v(offset); v(length); v(pinned); }
};

struct NodeTierW {  // one NUMA node's RAM tier
  int32_t node = 0;
  uint64_t capacity = 0, used = 0, dirty = 0, tensors = 0;
  template <class V> void visit(V& v) { v(node); v(capacity); v(used); v(dirty); v(tensors); }
};
struct NvmeTierW {  // one NVMe directory
  std::string path;
  int32_t numa_node = -1;
  std::string backend;  // "io_uring" or "pread"
  uint64_t capacity = 0, used = 0;
  template <class V> void visit(V& v) { v(path); v(numa_node); v(backend); v(capacity); v(used); }
};
struct StatusRep {
  std::string daemon_version;
  uint64_t uptime_ms = 0;
  uint32_t clients = 0, pools = 0;
  uint64_t leases = 0;
  std::vector<NodeTierW> ram;
  std::vector<NvmeTierW> nvme;
  // Counters since start.
  uint64_t bytes_read = 0, bytes_written = 0;  // NVMe
  uint64_t hits = 0, misses = 0, stalls = 0, evictions = 0, prefetches = 0;
  uint64_t requests = 0, errors = 0;
  template <class V> void visit(V& v) {
    v(daemon_version); v(uptime_ms); v(clients); v(pools); v(leases); v(ram); v(nvme);
    v(bytes_read); v(bytes_written); v(hits); v(misses); v(stalls); v(evictions); v(prefetches);
    v(requests); v(errors);
  }
};

// StatusRep's counters, copied between the structs that name them alike: the daemon's
// Counters and its NVMe tier's TierStats into StatusRep, StatusRep into the client's
// NodeStatus. Said once, so a new counter cannot be forgotten in one of the copies.
template <class To, class From>
void copy_cache_counters(To& to, const From& from) {
  to.hits = from.hits;
  to.misses = from.misses;
  to.stalls = from.stalls;
  to.evictions = from.evictions;
  to.prefetches = from.prefetches;
}
template <class To, class From>
void copy_counters(To& to, const From& from) {
  to.bytes_read = from.bytes_read;
  to.bytes_written = from.bytes_written;
  copy_cache_counters(to, from);
  to.requests = from.requests;
  to.errors = from.errors;
}

struct TopoNodeW {
  int32_t id = 0;
  uint64_t memory = 0;
  std::string cpus;  // "0-63,128-191"
  template <class V> void visit(V& v) { v(id); v(memory); v(cpus); }
};
struct TopoDevW {
  int32_t index = 0;
  std::string name;
  std::string pci;  // "0000:07:00.0"
  int32_t numa_node = -1;
  template <class V> void visit(V& v) { v(index); v(name); v(pci); v(numa_node); }
};
struct TopoRep {
  std::string source;  // "hwloc:this system", "hwloc:synthetic ...", "hwloc:xml FILE"
  std::vector<TopoNodeW> nodes;
  std::vector<TopoDevW> gpus;
  std::vector<TopoDevW> nvme;
  template <class V> void visit(V& v) { v(source); v(nodes); v(gpus); v(nvme); }
};

struct TensorIdsReq {  // Prefetch, Evict, Discard (empty ids + pool = whole pool for Evict)
  std::string pool;
  std::vector<uint64_t> tensor_ids;
  template <class V> void visit(V& v) { v(pool); v(tensor_ids); }
};
struct PlanSetReq {
  std::string pool;
  std::vector<uint64_t> tensor_ids;  // one step's uses in order; repeats every step
  uint64_t budget = 0;               // bytes of the plan to keep resident ahead; 0 = daemon default
  std::vector<uint8_t> overwrite;    // empty, or per use: 1 = the use overwrites (nothing to fetch)
  template <class V> void visit(V& v) { v(pool); v(tensor_ids); v(budget); v(overwrite); }
};
struct SnapshotRep {
  uint64_t snapshot_id = 0;
  uint64_t bytes = 0;
  uint64_t stall_us = 0;  // how long the pool was frozen for the point-in-time copy
  template <class V> void visit(V& v) { v(snapshot_id); v(bytes); v(stall_us); }
};
struct SnapshotTakeReq {  // reply: SnapshotRep
  std::string pool;
  uint64_t tag = 0;   // the client's label (e.g. a training step); 0: none
  uint32_t keep = 1;  // durable snapshots of the pool kept once this one is durable (>= 1)
  template <class V> void visit(V& v) { v(pool); v(tag); v(keep); }
};
struct SnapshotInfoW {
  uint64_t snapshot_id = 0;
  uint64_t tag = 0;
  uint64_t bytes = 0;
  template <class V> void visit(V& v) { v(snapshot_id); v(tag); v(bytes); }
};
struct SnapshotListRep {  // request: PoolNameReq
  // A restart rebuilt the pool after losing its RAM (a reboot) and it has not been restored
  // since: its bytes are the snapshot `recovered_from` (0: none) plus newer NVMe copies.
  bool recovered = false;
  uint64_t recovered_from = 0;
  uint64_t lost = 0;                     // tensors that restart could not bring back
  std::vector<SnapshotInfoW> snapshots;  // durable ones, oldest first
  template <class V> void visit(V& v) { v(recovered); v(recovered_from); v(lost); v(snapshots); }
};
struct SnapshotRestoreReq {
  std::string pool;
  uint64_t snapshot_id = 0;
  template <class V> void visit(V& v) { v(pool); v(snapshot_id); }
};
struct SnapshotRestoreRep {
  uint64_t tensors = 0;  // restored to their bytes as of the snapshot
  uint64_t bytes = 0;
  uint64_t deleted = 0;  // tensors the snapshot does not hold
  uint64_t dropped_snapshots = 0;  // newer snapshots, dropped
  template <class V> void visit(V& v) { v(tensors); v(bytes); v(deleted); v(dropped_snapshots); }
};
struct TextRep {  // Metrics (Prometheus text), one page of at most kMaxStringBytes
  std::string text;
  bool more = false;  // further pages follow: ask for page + 1
  template <class V> void visit(V& v) { v(text); v(more); }
};
struct MetricsReq {  // an empty payload means page 0 (older clients)
  uint32_t page = 0;
  template <class V> void visit(V& v) { v(page); }
};
struct Empty {
  template <class V> void visit(V&) {}
};

// --- framing ---

// Appends header + payload for `msg` to `out` (cleared first). Fails with kInvalidArgument
// when the encoded message would exceed kMaxMessageBytes.
template <class T>
[[nodiscard]] Status encode(uint16_t type, uint32_t request_id, const T& msg, std::vector<std::byte>& out);

// A reply: status first, then the body when status is ok.
template <class T>
[[nodiscard]] Status encode_reply(uint16_t request_type, uint32_t request_id, const Status& st,
                                  const T& body, std::vector<std::byte>& out);

// Validates magic, version and payload length of a whole datagram.
[[nodiscard]] Result<Header> parse_header(std::span<const std::byte> datagram);

// Decodes a payload that must be consumed exactly.
template <class T>
[[nodiscard]] Result<T> decode(std::span<const std::byte> payload);

// Decodes a reply payload: the status, and the body when the status is ok. A non-ok status
// is returned as the error.
template <class T>
[[nodiscard]] Result<T> decode_reply(std::span<const std::byte> payload);

[[nodiscard]] inline std::span<const std::byte> payload_of(std::span<const std::byte> datagram) {
  return datagram.subspan(kHeaderBytes);
}

// --- conversions between the wire structs and the public types ---
[[nodiscard]] PoolInfo to_public(const PoolInfoW& w);
[[nodiscard]] TensorInfo to_public(const TensorInfoW& w);
[[nodiscard]] PoolInfoW to_wire(const PoolInfo& p);
[[nodiscard]] TensorInfoW to_wire(const TensorInfo& t);

// ---- template definitions ----

template <class T>
Status encode(uint16_t type, uint32_t request_id, const T& msg, std::vector<std::byte>& out) {
  out.clear();
  out.resize(kHeaderBytes);
  Writer w(out);
  w(msg);
  if (out.size() > kMaxMessageBytes)
    return Status(Code::kInvalidArgument, "message of " + std::to_string(out.size()) +
                                              " bytes exceeds the protocol limit of 64 KiB");
  Header h;
  h.type = type;
  h.request_id = request_id;
  h.payload_len = static_cast<uint32_t>(out.size() - kHeaderBytes);
  std::memcpy(out.data(), &h, kHeaderBytes);
  return Status::ok();
}

template <class T>
Status encode_reply(uint16_t request_type, uint32_t request_id, const Status& st, const T& body,
                    std::vector<std::byte>& out) {
  out.clear();
  out.resize(kHeaderBytes);
  Writer w(out);
  ReplyStatus rs{static_cast<uint16_t>(st.code()), st.message()};
  if (rs.message.size() > kMaxStringBytes) rs.message.resize(kMaxStringBytes);
  w(rs);
  if (st.is_ok()) w(body);
  if (out.size() > kMaxMessageBytes)
    return Status(Code::kInternal, "reply exceeds the protocol limit of 64 KiB");
  Header h;
  h.type = static_cast<uint16_t>(request_type | kReplyBit);
  h.request_id = request_id;
  h.payload_len = static_cast<uint32_t>(out.size() - kHeaderBytes);
  std::memcpy(out.data(), &h, kHeaderBytes);
  return Status::ok();
}

template <class T>
Result<T> decode(std::span<const std::byte> payload) {
  T msg{};
  Reader r(payload);
  r(msg);
  if (!r.ok()) return fail(Code::kProtocol, "truncated or malformed message body");
  if (!r.at_end()) return fail(Code::kProtocol, "trailing bytes after message body");
  return msg;
}

template <class T>
Result<T> decode_reply(std::span<const std::byte> payload) {
  Reader r(payload);
  ReplyStatus rs;
  r(rs);
  if (!r.ok()) return fail(Code::kProtocol, "truncated reply status");
  if (rs.code != 0) {
    if (rs.code > kMaxCode) return fail(Code::kProtocol, "unknown status code in reply");
    if (!r.at_end()) return fail(Code::kProtocol, "trailing bytes after error reply");
    return fail(static_cast<Code>(rs.code), std::move(rs.message));
  }
  T body{};
  r(body);
  if (!r.ok()) return fail(Code::kProtocol, "truncated or malformed reply body");
  if (!r.at_end()) return fail(Code::kProtocol, "trailing bytes after reply body");
  return body;
}

}  // namespace tier::wire
// clang-format on
