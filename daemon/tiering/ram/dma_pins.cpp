#include "ram/dma_pins.hpp"

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

Status DmaPins::add(uint64_t session, uid_t uid, uint64_t arena, uint64_t offset, uint64_t length,
                    uint64_t uid_cap) {
  uint64_t b = 0, e = 0;
  if (!page_range(offset, length, b, e))
    return Status(Code::kInvalidArgument, "pinned range is empty or overflows");
  const size_t held = sessions_.contains(session) ? sessions_[session] : 0;
  if (held >= kMaxPinsPerSession)
    return Status(Code::kResourceExhausted,
                  "this connection already holds " + std::to_string(held) + " arena pins");
  const UidCount mine = uids_.contains(uid) ? uids_[uid] : UidCount{};
  if (mine.pins >= kMaxPinsPerUid)
    return Status(Code::kResourceExhausted, "uid " + std::to_string(uid) + " already holds " +
                                                std::to_string(mine.pins) + " arena pins");
  if (e - b > uid_cap || mine.bytes > uid_cap - (e - b))
    return Status(Code::kResourceExhausted, "uid " + std::to_string(uid) + " has " +
                                                std::to_string(mine.bytes) + " bytes of arenas pinned; " +
                                                std::to_string(e - b) + " more would pass its limit of " +
                                                std::to_string(uid_cap) + " (uid_pinned_quota)");
  pins_[arena].push_back({session, b, e, uid});
  UidCount& u = uids_[uid];
  u.bytes += e - b;
  u.pins++;
  sessions_[session]++;
  count_++;
  return Status::ok();
}

void DmaPins::uncount(const Pin& p) {
  if (auto it = uids_.find(p.uid); it != uids_.end()) {
    it->second.bytes -= std::min(it->second.bytes, p.end - p.begin);
    if (--it->second.pins == 0) uids_.erase(it);
  }
  if (auto it = sessions_.find(p.session); it != sessions_.end() && --it->second == 0) sessions_.erase(it);
  count_--;
}

uint64_t DmaPins::uid_bytes(uid_t uid) const noexcept {
  auto it = uids_.find(uid);
  return it == uids_.end() ? 0 : it->second.bytes;
}

Status DmaPins::remove(uint64_t session, uint64_t arena, uint64_t offset, uint64_t length, Range* gone) {
  uint64_t b = 0, e = 0;
  if (!page_range(offset, length, b, e))
    return Status(Code::kInvalidArgument, "pinned range is empty or overflows");
  auto a = pins_.find(arena);
  if (a == pins_.end()) return Status(Code::kNotFound, "no such pin on this connection");
  auto it = std::ranges::find_if(
      a->second, [&](const Pin& p) { return p.session == session && p.begin == b && p.end == e; });
  if (it == a->second.end()) return Status(Code::kNotFound, "no such pin on this connection");
  if (gone) *gone = {b, e};
  uncount(*it);
  a->second.erase(it);
  if (a->second.empty()) pins_.erase(a);
  return Status::ok();
}

template <class Pred> std::vector<DmaPins::Gone> DmaPins::drop_if(Pred pred) {
  std::vector<Gone> out;
  for (auto it = pins_.begin(); it != pins_.end();) {
    const uint64_t arena = it->first;
    std::erase_if(it->second, [&](const Pin& p) {
      if (!pred(arena, p)) return false;
      out.push_back({arena, {p.begin, p.end}});
      uncount(p);
      return true;
    });
    it = it->second.empty() ? pins_.erase(it) : std::next(it);
  }
  return out;
}

std::vector<DmaPins::Gone> DmaPins::drop_session(uint64_t session) {
  if (!sessions_.contains(session)) return {};
  return drop_if([&](uint64_t, const Pin& p) { return p.session == session; });
}

std::vector<DmaPins::Gone> DmaPins::drop_arena(uint64_t arena) {
  if (!pins_.contains(arena)) return {};
  return drop_if([&](uint64_t a, const Pin&) { return a == arena; });
}

std::vector<DmaPins::Range> DmaPins::covered(uint64_t arena) const {
  auto a = pins_.find(arena);
  if (a == pins_.end()) return {};
  std::vector<Range> spans;
  for (const Pin& p : a->second) spans.emplace_back(p.begin, p.end);
  std::ranges::sort(spans);
  std::vector<Range> out;
  for (auto [b, e] : spans) {
    if (!out.empty() && b <= out.back().second) out.back().second = std::max(out.back().second, e);
    else out.emplace_back(b, e);
  }
  return out;
}

uint64_t DmaPins::overlap(uint64_t arena, uint64_t offset, uint64_t length) const {
  if (!pins_.contains(arena)) return 0;
  uint64_t free = 0;
  for (auto [off, len] : unpinned(arena, offset, length)) free += len;
  return length - free;
}

std::vector<std::pair<uint64_t, uint64_t>> DmaPins::unpinned(uint64_t arena, uint64_t offset,
                                                             uint64_t length) const {
  const uint64_t end = offset + length;
  std::vector<std::pair<uint64_t, uint64_t>> cover;  // pins overlapping the range, clipped
  if (auto a = pins_.find(arena); a != pins_.end())
    for (const Pin& p : a->second)
      if (p.begin < end && p.end > offset)
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
  for (const auto& [arena, v] : pins_)
    for (const Pin& p : v) n += p.end - p.begin;
  return n;
}

}  // namespace tier::daemon
