// The input format of fuzz_request, shared by the target and the corpus generator:
//   byte 0      which peer the session is: uid_for(byte 0)
//   then        datagrams, each as a u16 little-endian length and that many bytes; a length
//               running past the end takes what is left.
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

inline std::vector<std::byte> frame(uint8_t uid_sel,
                                    const std::vector<std::vector<std::byte>>& msgs) {
  std::vector<std::byte> out{std::byte{uid_sel}};
  for (const auto& m : msgs) {
    uint16_t n = static_cast<uint16_t>(m.size());
    out.push_back(std::byte(n & 0xff));
    out.push_back(std::byte(n >> 8));
    out.insert(out.end(), m.begin(), m.begin() + n);
  }
  return out;
}

// Calls f(datagram) for each framed datagram after byte 0.
template <class F>
void for_each_datagram(std::span<const std::byte> in, F&& f) {
  size_t pos = 1;
  while (pos + 2 <= in.size()) {
    size_t n = std::to_integer<size_t>(in[pos]) | (std::to_integer<size_t>(in[pos + 1]) << 8);
    pos += 2;
    n = std::min(n, in.size() - pos);
    if (!f(in.subspan(pos, n))) return;
    pos += n;
  }
}

}  // namespace fuzzreq
