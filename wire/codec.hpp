// The wire codec: a bounds-checked binary encoding for control messages.
//
// Every message struct declares its fields once, in `template <class V> void visit(V& v)`,
// and the same declaration drives encoding (Writer), sizing (SizeCounter, encoded_size()) and
// decoding (Reader), so they can never disagree. Integers are little-endian fixed width;
// strings and vectors carry a u32 length. A Reader never reads past its span: any overrun,
// oversized count or trailing byte makes the whole decode fail with kProtocol. Only the daemon
// and libtier link this.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tier/status.hpp"

namespace tier::wire {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and tierd only runs on little-endian hosts");

// Upper bound on any single string field (names, messages, paths). Part of the protocol.
inline constexpr uint32_t kMaxStringBytes = 4096;

namespace detail {
// Where a BasicWriter's bytes go: appended to a byte vector, or only counted.
struct AppendBytes {
  std::vector<std::byte>& out;
  void operator()(const void* p, size_t n) {
    auto b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
};
struct CountBytes {
  size_t n = 0;
  void operator()(const void*, size_t k) { n += k; }
};
}  // namespace detail

// Walks a value's fields in visit() order and hands each field's bytes to `Sink`.
template <class Sink> class BasicWriter {
 public:
  template <class... A> explicit BasicWriter(A&&... a) : sink_{std::forward<A>(a)...} {}
  const Sink& sink() const { return sink_; }

  template <class T>
    requires(std::is_integral_v<T> || std::is_enum_v<T>)
  void operator()(const T& v) {
    sink_(&v, sizeof(T));
  }
  void operator()(const double& v) { sink_(&v, sizeof v); }
  void operator()(const bool& v) {
    uint8_t b = v ? 1 : 0;
    sink_(&b, 1);
  }
  void operator()(const std::string& s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    sink_(&n, 4);
    sink_(s.data(), s.size());
  }
  template <class T> void operator()(const std::vector<T>& vec) {
    uint32_t n = static_cast<uint32_t>(vec.size());
    sink_(&n, 4);
    for (const T& e : vec) (*this)(e);
  }
  template <class T>
    requires requires(T& t, BasicWriter& w) { t.visit(w); }
  void operator()(const T& v) {
    const_cast<T&>(v).visit(*this);  // visit only reads fields when given a writer
  }

 private:
  Sink sink_;
};

// Encodes: `Writer w(out); w(msg);` appends msg's bytes to `out`.
using Writer = BasicWriter<detail::AppendBytes>;
// Counts the bytes a Writer would append, writing nothing: an encoding's size comes from the
// very code that encodes it, so a reply can be sized before it is built.
using SizeCounter = BasicWriter<detail::CountBytes>;

// Bytes the Writer appends for `v` (a message's payload, without the Header).
template <class T> [[nodiscard]] size_t encoded_size(const T& v) {
  SizeCounter c;
  c(v);
  return c.sink().n;
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }
  size_t remaining() const { return in_.size() - pos_; }

  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  void operator()(T& v) {
    take(&v, sizeof(T));
  }
  template <class T>
    requires std::is_enum_v<T>
  void operator()(T& v) {
    std::underlying_type_t<T> raw{};
    take(&raw, sizeof raw);
    v = static_cast<T>(raw);  // range checked by the message's own validation
  }
  void operator()(double& v) { take(&v, sizeof v); }
  void operator()(bool& v) {
    uint8_t b = 0;
    take(&b, 1);
    if (b > 1) ok_ = false;
    v = b == 1;
  }
  void operator()(std::string& s) {
    uint32_t n = 0;
    take(&n, 4);
    if (!ok_ || n > kMaxStringBytes || n > remaining()) {
      ok_ = false;
      return;
    }
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
  }
  template <class T> void operator()(std::vector<T>& vec) {
    uint32_t n = 0;
    take(&n, 4);
    // Every element takes at least one byte, so a count above the bytes left is a lie:
    // refusing it here keeps a hostile count from reserving gigabytes.
    if (!ok_ || n > remaining()) {
      ok_ = false;
      return;
    }
    vec.clear();
    vec.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) {
      T e{};
      (*this)(e);
      vec.push_back(std::move(e));
    }
  }
  template <class T>
    requires requires(T& t, Reader& r) { t.visit(r); }
  void operator()(T& v) {
    v.visit(*this);
  }

 private:
  void take(void* p, size_t n) {
    if (!ok_ || n > remaining()) {
      ok_ = false;
      std::memset(p, 0, n);
      return;
    }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace tier::wire
