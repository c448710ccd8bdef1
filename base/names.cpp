#include "base/names.hpp"

#include "base/errors.hpp"

namespace tier {

Status validate_pool_name(std::string_view name) {
  if (name.empty() || name.size() > 255)
    return Status(Code::kInvalidArgument, "pool name must be 1..255 characters");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
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
    if ((b & 0xe0) == 0xc0) {
      len = 2;
      cp = b & 0x1fu;
      min = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
      len = 3;
      cp = b & 0x0fu;
      min = 0x800;
    } else if ((b & 0xf8) == 0xf0) {
      len = 4;
      cp = b & 0x07u;
      min = 0x10000;
    } else return i;            // a continuation byte where a sequence starts, or 0xf8..0xff
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
  TIER_TRY(validate_stored_tensor_name(name));
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
