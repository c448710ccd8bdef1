#include "tier/types.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tier {

namespace {
struct DTypeRow { DType d; std::string_view name; size_t bytes; };
constexpr std::array<DTypeRow, 9> kDTypes{{
    {DType::kBytes, "bytes", 1}, {DType::kF32, "f32", 4}, {DType::kF16, "f16", 2},
    {DType::kBF16, "bf16", 2},   {DType::kF64, "f64", 8}, {DType::kI32, "i32", 4},
    {DType::kI64, "i64", 8},     {DType::kU8, "u8", 1},   {DType::kI8, "i8", 1},
}};
}  // namespace

std::string_view dtype_name(DType d) noexcept {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.name;
  return "unknown";
}

std::optional<DType> dtype_from_name(std::string_view s) noexcept {
  for (const auto& r : kDTypes)
    if (r.name == s) return r.d;
  return std::nullopt;
}

size_t dtype_size(DType d) noexcept {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.bytes;
  return 1;
}

Result<uint64_t> parse_size(std::string_view text, std::optional<uint64_t> total) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "invalid size '" + std::string(text) + "': " + std::string(why));
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
      case 'k': case 'K': mult = 1ULL << 10; break;
      case 'm': case 'M': mult = 1ULL << 20; break;
      case 'g': case 'G': mult = 1ULL << 30; break;
      case 't': case 'T': mult = 1ULL << 40; break;
      case 'p': case 'P': mult = 1ULL << 50; break;
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
  while (v >= 1024 && u < 5) { v /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

Status validate_pool_name(std::string_view name) {
  if (name.empty() || name.size() > 255)
    return Status(Code::kInvalidArgument, "pool name must be 1..255 characters");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok)
      return Status(Code::kInvalidArgument,
                    "pool name '" + std::string(name) + "' may only use [A-Za-z0-9._-]");
  }
  if (name == "." || name == "..") return Status(Code::kInvalidArgument, "pool name may not be . or ..");
  return Status::ok();
}

Status validate_stored_tensor_name(std::string_view name) {
  if (name.empty() || name.size() > 255)
    return Status(Code::kInvalidArgument, "tensor name must be 1..255 bytes");
  for (char c : name)
    if (c == '/' || c == '\0')
      return Status(Code::kInvalidArgument, "tensor name may not contain '/' or NUL");
  return Status::ok();
}

size_t first_unprintable(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      if (b < 0x20 || b == 0x7f) return i;  // C0 controls and DEL
      ++i;
      continue;
    }
    // The length of the sequence and the range its code point must lie in (no overlong forms).
    size_t len;
    uint32_t cp, min;
    if ((b & 0xe0) == 0xc0) { len = 2; cp = b & 0x1fu; min = 0x80; }
    else if ((b & 0xf0) == 0xe0) { len = 3; cp = b & 0x0fu; min = 0x800; }
    else if ((b & 0xf8) == 0xf0) { len = 4; cp = b & 0x07u; min = 0x10000; }
    else return i;  // a continuation byte where a sequence starts, or 0xf8..0xff
    if (n - i < len) return i;  // truncated
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    if (cp >= 0x80 && cp <= 0x9f) return i;  // C1 controls
    i += len;
  }
  return std::string_view::npos;
}

Status validate_tensor_name(std::string_view name) {
  TIER_RETURN_IF_ERROR(validate_stored_tensor_name(name));
  if (size_t at = first_unprintable(name); at != std::string_view::npos) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "tensor name has an unprintable or malformed byte 0x%02x at offset %zu: names are "
                  "printable UTF-8 (no control characters)",
                  static_cast<unsigned>(static_cast<unsigned char>(name[at])), at);
    return Status(Code::kInvalidArgument, buf);
  }
  return Status::ok();
}

}  // namespace tier
