// The rules for pool and tensor names, checked by tierd on every create and by the client
// tools before they send one. Internal to the project: not part of libtier's public API.
#pragma once

#include <cstddef>
#include <string_view>

#include "tier/status.hpp"

namespace tier {

// Names of pools: 1..255 of [A-Za-z0-9._-]. Tensor names: 1..255 bytes of printable UTF-8
// (see first_unprintable), no '/'. Names are printed raw by tables and logs, so a control
// character in one (a newline, an ESC sequence) could forge or hide output: tierd refuses them.
[[nodiscard]] Status validate_pool_name(std::string_view name);
[[nodiscard]] Status validate_tensor_name(std::string_view name);
// The structural part of a tensor name only (1..255 bytes, no '/' or NUL): what a catalog
// written by an older tierd, which did not refuse control characters, may hold. New names are
// checked with validate_tensor_name.
[[nodiscard]] Status validate_stored_tensor_name(std::string_view name);
// The offset of the first byte of `s` that does not begin printable UTF-8, or npos: a
// malformed sequence (stray continuation byte, truncated, overlong, surrogate, above U+10FFFF),
// a C0 control (U+0000..U+001F), DEL (U+007F) or a C1 control (U+0080..U+009F).
[[nodiscard]] size_t first_unprintable(std::string_view s) noexcept;

}  // namespace tier
