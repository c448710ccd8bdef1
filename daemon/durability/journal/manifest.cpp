#include "journal/manifest.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "journal/journal.hpp"
#include "journal/reader.hpp"
#include "base/errors.hpp"

namespace tier::journal {
namespace {

uint64_t tensor_bytes(std::span<const Record> body) {
  uint64_t sum = 0;
  for (const Record& r : body)
    if (auto* t = std::get_if<TensorCreated>(&r)) sum += t->size;
  return sum;
}

bool is_frame(const Record& r) {
  return std::holds_alternative<ManifestBegin>(r) || std::holds_alternative<ManifestEnd>(r);
}

}  // namespace

Status write_manifest(const std::string& path, const ManifestBegin& begin, std::span<const Record> body) {
  std::vector<std::byte> out;
  encode_file_header(kManifestMagic, 1, 0, out);
  uint64_t seq = 1;
  TIER_TRY(encode_record(begin, seq++, out));
  for (const Record& r : body) {
    if (is_frame(r))
      return Status(Code::kInvalidArgument, "a manifest body cannot contain ManifestBegin/End");
    TIER_TRY(encode_record(r, seq++, out));
  }
  TIER_TRY(encode_record(ManifestEnd{body.size(), tensor_bytes(body)}, seq++, out));

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::from_errno(errno, "create " + tmp);
  Status st;
  size_t done = 0;
  while (done < out.size() && st.is_ok()) {
    ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) st = Status::from_errno(n < 0 ? errno : EIO, "write " + tmp);
    else done += static_cast<size_t>(n);
  }
  if (st.is_ok() && ::fdatasync(fd) != 0) st = Status::from_errno(errno, "fdatasync " + tmp);
  ::close(fd);
  if (st.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = Status::from_errno(errno, "rename " + tmp + " to " + path);
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_dir_of(path);
}

Result<Manifest> parse_manifest(std::span<const std::byte> image) {
  Manifest m;
  bool have_begin = false, have_end = false;
  uint64_t count = 0;
  auto res = scan(image, kManifestMagic, [&](const Record& r, uint64_t, size_t off) -> Status {
    if (have_end)
      return Status(Code::kCorruption,
                    "manifest has records after its end (offset " + std::to_string(off) + ")");
    if (!have_begin) {
      if (auto* b = std::get_if<ManifestBegin>(&r)) {
        m.begin = *b;
        have_begin = true;
        return Status::ok();
      }
      return Status(Code::kCorruption, "manifest does not start with ManifestBegin");
    }
    if (auto* e = std::get_if<ManifestEnd>(&r)) {
      m.end = *e;
      have_end = true;
      return Status::ok();
    }
    if (is_frame(r))
      return Status(Code::kCorruption,
                    "manifest has a second ManifestBegin at offset " + std::to_string(off));
    m.body.push_back(r);
    ++count;
    return Status::ok();
  });
  TIER_TRY(res);
  if (res->fresh || res->dropped_bytes > 0)
    return fail(Code::kCorruption, "manifest is truncated or damaged at offset " +
                                       std::to_string(res->valid_end) +
                                       " (manifests are written atomically; this one is not whole)");
  if (!have_begin || !have_end)
    return fail(Code::kCorruption, "manifest is incomplete (missing ManifestBegin or ManifestEnd)");
  if (m.end.records != count || m.end.bytes != tensor_bytes(m.body))
    return fail(Code::kCorruption, "manifest's end record disagrees with its contents");
  return m;
}

Result<Manifest> read_manifest(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(Status::from_errno(errno, "open " + path));
  auto data = read_whole_file(fd, path);
  ::close(fd);
  TIER_TRY(data);
  auto m = parse_manifest(*data);
  if (!m) return fail(m.error().code(), path + ": " + m.error().message());
  return m;
}

}  // namespace tier::journal
