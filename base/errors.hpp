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

namespace tier::detail {

// TIER_TRY's parts: whether a Status or Result failed, and its error on the way out of a
// function that returns a Status or any Result<T>.
inline bool failed(const Status& s) noexcept { return !s.is_ok(); }
template <class T> bool failed(const Result<T>& r) noexcept { return !r.has_value(); }
inline Status error_of(Status&& s) noexcept { return std::move(s); }
inline Status error_of(Status& s) noexcept { return std::move(s); }
template <class T> Status error_of(Result<T>&& r) noexcept { return std::move(r).error(); }
template <class T> Status error_of(Result<T>& r) noexcept { return std::move(r).error(); }

class Propagated {
 public:
  explicit Propagated(Status s) noexcept : status_(std::move(s)) {}
  operator Status() && noexcept { return std::move(status_); }  // NOLINT(google-explicit-constructor)
  template <class T> operator Result<T>() && {                  // NOLINT(google-explicit-constructor)
    return std::unexpected<Status>(std::move(status_));
  }

 private:
  Status status_;
};

}  // namespace tier::detail

// The one way to propagate a failure: when `expr` (a Status, or a Result<T> whose value is not
// needed; an lvalue's error is moved out) failed, return its Status from the enclosing function,
// which returns a Status or any Result<U>.
#define TIER_TRY(expr)                                                        \
  do {                                                                        \
    auto&& tier_try_ = (expr);                                                \
    if (::tier::detail::failed(tier_try_))                                    \
      return ::tier::detail::Propagated(::tier::detail::error_of(tier_try_)); \
  } while (0)

// The earlier spelling, kept for trainer/ until it moves to TIER_TRY.
#define TIER_RETURN_IF_ERROR(expr) TIER_TRY(expr)
