#include "daemon/dma_pins.hpp"

#include <algorithm>
#include <string>

namespace tier::daemon {
namespace {

// [offset, offset+length) widened to whole pages; false when empty or it overflows.
bool page_range(uint64_t offset, uint64_t length, uint64_t& begin, uint64_t& end) {
  if (length == 0 || length > UINT64_MAX - DmaPins::kPage || offset > UINT64_MAX - DmaPins::kPage - length)
    return false;
  begin = offset / DmaPins::kPage * DmaPins::kPage;
  end = (offset + length + DmaPins::kPage - 1) / DmaPins::kPage * DmaPins::kPage;
  return true;
}

}  // namespace

Status DmaPins::add(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length) {
  uint64_t b = 0, e = 0;
  if (!page_range(offset, length, b, e))
    return Status(Code::kInvalidArgument, "pinned range is empty or overflows");
  const auto held = std::ranges::count_if(pins_, [&](const Pin& p) { return p.session == session; });
  if (static_cast<size_t>(held) >= kMaxPinsPerSession)
    return Status(Code::kResourceExhausted,
                  "this connection already holds " + std::to_string(held) + " arena pins");
  pins_.push_back({session, arena, b, e});
  return Status::ok();
}

Status DmaPins::remove(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length) {
  uint64_t b = 0, e = 0;
  if (!page_range(offset, length, b, e))
    return Status(Code::kInvalidArgument, "pinned range is empty or overflows");
  auto it = std::ranges::find_if(pins_, [&](const Pin& p) {
    return p.session == session && p.arena == arena && p.begin == b && p.end == e;
  });
  if (it == pins_.end()) return Status(Code::kNotFound, "no such pin on this connection");
  pins_.erase(it);
  return Status::ok();
}

void DmaPins::drop_session(uint64_t session) {
  std::erase_if(pins_, [&](const Pin& p) { return p.session == session; });
}

std::vector<std::pair<uint64_t, uint64_t>> DmaPins::unpinned(uint64_t arena, uint64_t offset,
                                                             uint64_t length) const {
  const uint64_t end = offset + length;
  std::vector<std::pair<uint64_t, uint64_t>> cover;  // pins overlapping the range, clipped
  for (const Pin& p : pins_)
    if (p.arena == arena && p.begin < end && p.end > offset)
      cover.emplace_back(std::max(p.begin, offset), std::min(p.end, end));
  std::ranges::sort(cover);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t pos = offset;
  for (auto [b, e] : cover) {
    if (b > pos) out.emplace_back(pos, b - pos);
    pos = std::max(pos, e);
  }
  if (pos < end) out.emplace_back(pos, end - pos);
  return out;
}

uint64_t DmaPins::pinned_bytes() const noexcept {
  uint64_t n = 0;
  for (const Pin& p : pins_) n += p.end - p.begin;
  return n;
}

}  // namespace tier::daemon
