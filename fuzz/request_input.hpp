// The input format of fuzz_request, shared by the target and the corpus generator:
//   byte 0      the peers of two sessions: A is uid_for(byte 0), B is uid_for(byte 0 >> 2)
//   then        datagrams, each as a u16 little-endian word and that many bytes: bits 0..14
//               are the length (a length running past the end takes what is left), bit 15
//               picks the session (0: A, 1: B).
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

namespace fuzzreq {

inline constexpr uint32_t kUids[] = {0, 1000, 1001, 65534};

inline uint32_t uid_for(uint8_t sel) { return kUids[sel % 4]; }

inline constexpr uint16_t kSessionBit = 0x8000;

// `msgs` go to session A; `to_b` (same length, optional) marks those for session B.
inline std::vector<std::byte> frame(uint8_t uid_sel, const std::vector<std::vector<std::byte>>& msgs,
                                    const std::vector<bool>& to_b = {}) {
  std::vector<std::byte> out{std::byte{uid_sel}};
  for (size_t i = 0; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    uint16_t n = static_cast<uint16_t>(std::min<size_t>(m.size(), kSessionBit - 1));
    if (i < to_b.size() && to_b[i]) n |= kSessionBit;
    out.push_back(std::byte(n & 0xff));
    out.push_back(std::byte(n >> 8));
    out.insert(out.end(), m.begin(), m.begin() + (n & ~kSessionBit));
  }
  return out;
}

// Calls f(session, datagram) (session 0 = A, 1 = B) for each framed datagram after byte 0,
// until f returns false.
template <class F> void for_each_datagram(std::span<const std::byte> in, F&& f) {
  size_t pos = 1;
  while (pos + 2 <= in.size()) {
    size_t w = std::to_integer<size_t>(in[pos]) | (std::to_integer<size_t>(in[pos + 1]) << 8);
    pos += 2;
    size_t n = std::min(w & (kSessionBit - 1), in.size() - pos);
    if (!f(int(w >> 15), in.subspan(pos, n))) return;
    pos += n;
  }
}

}  // namespace fuzzreq
