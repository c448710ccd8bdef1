#include "tier/status.hpp"

#include <cstring>

namespace tier {

std::string_view code_name(Code c) noexcept {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kResourceExhausted: return "ResourceExhausted";
    case Code::kBusy: return "Busy";
    case Code::kTimeout: return "Timeout";
    case Code::kIo: return "IOError";
    case Code::kCorruption: return "Corruption";
    case Code::kProtocol: return "ProtocolError";
    case Code::kUnavailable: return "Unavailable";
    case Code::kUnsupported: return "Unsupported";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

Status Status::from_errno(int err, std::string_view context) {
  Code code;
  switch (err) {
    case ENOENT: code = Code::kNotFound; break;
    case EEXIST: code = Code::kAlreadyExists; break;
    case EACCES:
    case EPERM: code = Code::kPermissionDenied; break;
    case ENOSPC:
    case ENOMEM:
    case EDQUOT:
    case EMFILE:
    case ENFILE: code = Code::kResourceExhausted; break;
    case EINVAL: code = Code::kInvalidArgument; break;
    case EAGAIN:
    case EBUSY: code = Code::kBusy; break;
    case ETIMEDOUT: code = Code::kTimeout; break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN: code = Code::kUnavailable; break;
    case ENOSYS:
    case EOPNOTSUPP: code = Code::kUnsupported; break;
    case EBADMSG: code = Code::kCorruption; break;
    default: code = Code::kIo; break;
  }
  char buf[128];
  const char* text = strerror_r(err, buf, sizeof buf);  // GNU variant
  std::string msg(context);
  msg += ": ";
  msg += text;
  return Status(code, std::move(msg));
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  std::string s(code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace tier
