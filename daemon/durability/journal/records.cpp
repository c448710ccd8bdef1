#include "journal/records.hpp"

#include <utility>

#include "journal/format.hpp"
#include "base/errors.hpp"

namespace tier::journal {
namespace {

// Alternative i of Record must be RecordType i + 1: decode_payload indexes by type.
template <size_t... I> constexpr bool types_match_indices(std::index_sequence<I...>) {
  return ((static_cast<size_t>(std::variant_alternative_t<I, Record>::kType) == I + 1) && ...);
}
static_assert(types_match_indices(std::make_index_sequence<std::variant_size_v<Record>>{}),
              "Record alternatives must be ordered by RecordType");

template <class T> Result<Record> decode_as(std::span<const std::byte> payload) {
  T rec{};
  wire::Reader r(payload);
  r(rec);
  if (!r.ok() || !r.at_end())
    return fail(Code::kCorruption, std::string(record_type_name(T::kType)) + " record payload of " +
                                       std::to_string(payload.size()) + " bytes does not decode");
  return Record(std::move(rec));
}

template <size_t... I>
Result<Record> decode_indexed(size_t index, std::span<const std::byte> payload, std::index_sequence<I...>) {
  using Fn = Result<Record> (*)(std::span<const std::byte>);
  static constexpr Fn table[] = {&decode_as<std::variant_alternative_t<I, Record>>...};
  return table[index](payload);
}

}  // namespace

std::string_view record_type_name(RecordType t) noexcept {
  switch (t) {
    case RecordType::kPoolCreated: return "PoolCreated";
    case RecordType::kPoolDropped: return "PoolDropped";
    case RecordType::kTensorCreated: return "TensorCreated";
    case RecordType::kTensorDeleted: return "TensorDeleted";
    case RecordType::kNvmeCopyWritten: return "NvmeCopyWritten";
    case RecordType::kNvmeCopyDropped: return "NvmeCopyDropped";
    case RecordType::kSnapshotBegun: return "SnapshotBegun";
    case RecordType::kSnapshotDurable: return "SnapshotDurable";
    case RecordType::kSnapshotDropped: return "SnapshotDropped";
    case RecordType::kWatermarks: return "Watermarks";
    case RecordType::kTensorRamPlaced: return "TensorRamPlaced";
    case RecordType::kTensorRamDropped: return "TensorRamDropped";
    case RecordType::kArenaCreated: return "ArenaCreated";
    case RecordType::kManifestBegin: return "ManifestBegin";
    case RecordType::kManifestEnd: return "ManifestEnd";
    case RecordType::kWriteLeaseHeld: return "WriteLeaseHeld";
    case RecordType::kWriteLeaseEnded: return "WriteLeaseEnded";
    case RecordType::kSnapshotTagged: return "SnapshotTagged";
    case RecordType::kPoolRecovered: return "PoolRecovered";
    case RecordType::kPoolRestored: return "PoolRestored";
  }
  return "unknown";
}

RecordType record_type(const Record& r) noexcept {
  return std::visit([](const auto& rec) { return std::decay_t<decltype(rec)>::kType; }, r);
}

void encode_payload(const Record& r, std::vector<std::byte>& out) {
  wire::Writer w(out);
  std::visit([&](const auto& rec) { w(rec); }, r);
}

Result<Record> decode_payload(uint16_t type, std::span<const std::byte> payload) {
  if (type == 0 || type > kMaxRecordType)
    return fail(Code::kUnsupported, "record type " + std::to_string(type) +
                                        " is unknown to this tierd (journal format version " +
                                        std::to_string(kFormatVersion) + ")");
  return decode_indexed(type - 1u, payload, std::make_index_sequence<std::variant_size_v<Record>>{});
}

}  // namespace tier::journal
