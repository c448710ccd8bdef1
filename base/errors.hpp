// Shorthands for returning failures inside the project's code (tierd, libtier's sources,
// tierctl, tier-train). Not part of libtier's public API: a program using libtier spells
// std::unexpected(status) and its own early returns.
#pragma once

#include <expected>
#include <string>
#include <utility>

#include "tier/status.hpp"

namespace tier {

// Convenience for returning an error from a function that returns Result<T>.
inline std::unexpected<Status> fail(Code code, std::string message) {
  return std::unexpected<Status>(Status(code, std::move(message)));
}
inline std::unexpected<Status> fail(Status s) { return std::unexpected<Status>(std::move(s)); }

}  // namespace tier

// Propagate a failed Status / Result from the enclosing function.
#define TIER_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::tier::Status tier_status_ = (expr);           \
    if (!tier_status_.is_ok()) return tier_status_; \
  } while (0)
