// Status and Result: how every libtier and tierd call reports failure.
//
// A Status is a small value: a code and a human-readable message. Nothing in the public API
// throws or aborts on bad input; failures travel as Status, successes with a value as
// Result<T> (std::expected<T, Status>). errno is turned into a Status in one place,
// Status::from_errno, so the mapping of system errors to codes is uniform.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

#include "tier/export.hpp"

namespace tier {

// Wire-visible: the numeric values travel in replies and must not be renumbered.
enum class Code : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,    // the request is malformed or names something impossible
  kNotFound = 2,           // no such pool, tensor, lease or file
  kAlreadyExists = 3,      // create of a name that exists
  kPermissionDenied = 4,   // the peer's uid may not do this
  kResourceExhausted = 5,  // RAM/NVMe full, quota reached, too many leases
  kBusy = 6,               // a conflicting lease is held (fail-fast lease)
  kTimeout = 7,            // waited for a lease or I/O longer than asked
  kIo = 8,                 // an I/O error from the OS or the device
  kCorruption = 9,         // a checksum mismatch: data that must not be returned
  kProtocol = 10,          // malformed or unexpected bytes on the control socket
  kUnavailable = 11,       // the daemon cannot be reached (not running, socket closed)
  kUnsupported = 12,       // the feature is not available on this node or build
  kInternal = 13,          // an invariant broke inside tierd or libtier
};
inline constexpr uint16_t kMaxCode = 13;

[[nodiscard]] TIER_EXPORT std::string_view code_name(Code c) noexcept;

class [[nodiscard]] TIER_EXPORT Status {
 public:
  Status() noexcept = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() noexcept { return {}; }
  // The single place where errno values become Status: `context` says what was attempted
  // ("open /dev/shm/tier.p1.n0"), and the message reads "context: strerror(err)".
  static Status from_errno(int err, std::string_view context);

  bool is_ok() const noexcept { return code_ == Code::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  Code code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "NotFound: no pool named 'x'"; "OK" when ok.
  std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

template <class T> using Result = std::expected<T, Status>;

}  // namespace tier
