#include "wire/messages.hpp"
#include "base/errors.hpp"

namespace tier::wire {

Result<Header> parse_header(std::span<const std::byte> datagram) {
  if (datagram.size() < kHeaderBytes) return fail(Code::kProtocol, "message shorter than its header");
  if (datagram.size() > kMaxMessageBytes) return fail(Code::kProtocol, "message larger than 64 KiB");
  Header h;
  std::memcpy(&h, datagram.data(), kHeaderBytes);
  if (h.magic != kMagic) return fail(Code::kProtocol, "bad magic: not a tierd message");
  if (h.version != kVersion)
    return fail(Code::kProtocol, "protocol version " + std::to_string(h.version) +
                                     " is not supported (this side speaks " + std::to_string(kVersion) + ")");
  if (h.payload_len != datagram.size() - kHeaderBytes)
    return fail(Code::kProtocol, "payload length does not match the datagram size");
  uint16_t base = h.type & static_cast<uint16_t>(~kReplyBit);
  if (base == 0 || base > kMaxMsgType) return fail(Code::kProtocol, "unknown message type");
  return h;
}

PoolInfo to_public(const PoolInfoW& w) {
  return PoolInfo{w.id,       w.name,      w.owner_uid,    w.ram_quota, w.nvme_quota,
                  w.ram_used, w.nvme_used, w.tensor_count, w.group,     w.group_read};
}
PoolInfoW to_wire(const PoolInfo& p) {
  return PoolInfoW{p.id,       p.name,      p.owner_uid,    p.ram_quota, p.nvme_quota,
                   p.ram_used, p.nvme_used, p.tensor_count, p.group,     p.group_read};
}
namespace {

// The fields TensorInfo and TensorInfoW share by name and type (all but the dtype).
template <class To, class From> void copy_tensor_fields(To& to, const From& from) {
  to.id = from.id;
  to.name = from.name;
  to.size = from.size;
  to.shape = from.shape;
  to.numa_node = from.numa_node;
  to.tiers = from.tiers;
  to.dirty = from.dirty;
  to.readers = from.readers;
  to.writer = from.writer;
}

}  // namespace

TensorInfo to_public(const TensorInfoW& w) {
  TensorInfo t;
  copy_tensor_fields(t, w);
  t.dtype = w.dtype <= kMaxDType ? static_cast<DType>(w.dtype) : DType::kBytes;
  return t;
}
TensorInfoW to_wire(const TensorInfo& t) {
  TensorInfoW w;
  copy_tensor_fields(w, t);
  w.dtype = static_cast<uint8_t>(t.dtype);
  return w;
}

}  // namespace tier::wire
