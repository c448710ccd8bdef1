#include "base/sizes.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/errors.hpp"

namespace tier {

Result<uint64_t> parse_size(std::string_view text, std::optional<uint64_t> total) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument, "invalid size '" + std::string(text) + "': " + std::string(why));
  };
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  if (s.empty()) return bad("empty");
  double number = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), number);
  if (ec != std::errc() || !(number >= 0) || !std::isfinite(number)) return bad("not a number");
  std::string_view unit(end, s.data() + s.size() - end);
  if (unit == "%") {
    if (!total) return bad("a percentage needs a total to apply to");
    if (number > 100) return bad("percentage above 100");
    return static_cast<uint64_t>(static_cast<long double>(*total) * number / 100.0L);
  }
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.remove_suffix(1);
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.remove_suffix(1);
  long double mult = 1;
  if (unit.empty()) mult = 1;
  else if (unit.size() == 1) {
    switch (unit[0]) {
      case 'k':
      case 'K': mult = 1ULL << 10; break;
      case 'm':
      case 'M': mult = 1ULL << 20; break;
      case 'g':
      case 'G': mult = 1ULL << 30; break;
      case 't':
      case 'T': mult = 1ULL << 40; break;
      case 'p':
      case 'P': mult = 1ULL << 50; break;
      default: return bad("unknown unit (use K, M, G, T, P or %)");
    }
  } else {
    return bad("unknown unit (use K, M, G, T, P or %)");
  }
  long double bytes = static_cast<long double>(number) * mult;
  if (bytes >= 18446744073709551615.0L) return bad("too large");
  if (mult == 1 && number != std::floor(number)) return bad("fractional bytes");
  return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace tier
