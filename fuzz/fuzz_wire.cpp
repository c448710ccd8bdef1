// fuzz_wire: arbitrary bytes as a control datagram, and as the payload of every message type.
//
// Properties checked beyond "no crash, no sanitizer report":
//   - decode<T> is canonical: whatever decodes re-encodes to exactly the same bytes;
//   - decode_reply<T> of an ok reply re-encodes to a reply that decodes to the same body;
//   - parse_header accepts only datagrams whose payload length matches, and a request that
//     parses and decodes as its type re-encodes to the same datagram.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_check.hpp"
#include "wire/messages.hpp"

using namespace tier;
using namespace tier::wire;

namespace {

template <class T> std::vector<std::byte> encode_body(const T& msg) {
  std::vector<std::byte> out;
  Writer w(out);
  w(msg);
  return out;
}

template <class T> void check_body(std::span<const std::byte> payload) {
  if (auto r = decode<T>(payload)) {
    auto again = encode_body(*r);
    FUZZ_CHECK(again.size() == payload.size() && std::equal(again.begin(), again.end(), payload.begin()));
  }
  if (auto r = decode_reply<T>(payload)) {
    std::vector<std::byte> reply;
    if (encode_reply(1, 7, Status::ok(), *r, reply).is_ok()) {
      auto back = decode_reply<T>(payload_of(reply));
      FUZZ_CHECK(back.has_value());
      FUZZ_CHECK(encode_body(*back) == encode_body(*r));
    }
  } else {
    // An error reply carries a known code; anything else must be kProtocol from the decoder.
    FUZZ_CHECK(static_cast<uint16_t>(r.error().code()) <= kMaxCode);
  }
}

template <class... T> void check_all(std::span<const std::byte> payload) { (check_body<T>(payload), ...); }

// The request body of each MsgType, for the header-driven round trip.
template <class T> void check_request(const Header& h, std::span<const std::byte> datagram) {
  auto r = decode<T>(payload_of(datagram));
  if (!r) return;
  std::vector<std::byte> out;
  if (!encode(h.type, h.request_id, *r, out).is_ok()) return;
  FUZZ_CHECK(out.size() == datagram.size() && std::equal(out.begin(), out.end(), datagram.begin()));
}

void check_datagram(std::span<const std::byte> d) {
  auto h = parse_header(d);
  if (!h) return;
  FUZZ_CHECK(d.size() >= kHeaderBytes);
  FUZZ_CHECK(h->payload_len == d.size() - kHeaderBytes);
  FUZZ_CHECK(h->magic == kMagic && h->version == kVersion);
  switch (static_cast<MsgType>(h->type)) {
    case MsgType::kHello: check_request<HelloReq>(*h, d); break;
    case MsgType::kPoolCreate: check_request<PoolCreateReq>(*h, d); break;
    case MsgType::kPoolOpen:
    case MsgType::kPoolDrop:
    case MsgType::kSnapshot:
    case MsgType::kSnapshotList: check_request<PoolNameReq>(*h, d); break;
    case MsgType::kSnapshotTake: check_request<SnapshotTakeReq>(*h, d); break;
    case MsgType::kSnapshotRestore: check_request<SnapshotRestoreReq>(*h, d); break;
    case MsgType::kTensorCreate: check_request<TensorCreateReq>(*h, d); break;
    case MsgType::kTensorOpen:
    case MsgType::kTensorDelete: check_request<TensorRefReq>(*h, d); break;
    case MsgType::kTensorList: check_request<TensorListReq>(*h, d); break;
    case MsgType::kLease: check_request<LeaseReq>(*h, d); break;
    case MsgType::kRelease: check_request<ReleaseReq>(*h, d); break;
    case MsgType::kLeaseReclaim: check_request<LeaseReclaimReq>(*h, d); break;
    case MsgType::kMapArena: check_request<MapArenaReq>(*h, d); break;
    case MsgType::kPrefetch:
    case MsgType::kEvict: check_request<TensorIdsReq>(*h, d); break;
    case MsgType::kPlanSet: check_request<PlanSetReq>(*h, d); break;
    default: check_request<Empty>(*h, d); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check_datagram(in);
  // Every message body, from the payload of a datagram or from the raw input.
  std::span<const std::byte> payload = in.size() >= kHeaderBytes ? payload_of(in) : in;
  check_all<ReplyStatus, HelloReq, HelloRep, PoolInfoW, PoolCreateReq, PoolNameReq, PoolListRep, TensorInfoW,
            TensorCreateReq, TensorRefReq, TensorListReq, TensorListRep, LeaseReq, LeaseGrant, LeaseRep,
            ReleaseReq, LeaseReclaimReq, MapArenaReq, MapArenaRep, NodeTierW, NvmeTierW, StatusRep, TopoNodeW,
            TopoDevW, TopoRep, TensorIdsReq, PlanSetReq, SnapshotRep, SnapshotTakeReq, SnapshotInfoW,
            SnapshotListRep, SnapshotRestoreReq, SnapshotRestoreRep, TextRep, Empty>(payload);
  return 0;
}
