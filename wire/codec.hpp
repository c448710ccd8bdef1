// The wire codec: a bounds-checked binary encoding for control messages.
//
// Every message struct declares its fields once, in `template <class V> void visit(V& v)`,
// and the same declaration drives both encoding (Writer) and decoding (Reader), so the two
// can never disagree. Integers are little-endian fixed width; strings and vectors carry a
// u32 length. A Reader never reads past its span: any overrun, oversized count or trailing
// byte makes the whole decode fail with kProtocol. Only the daemon and libtier link this.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tier/status.hpp"

namespace tier::wire {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and tierd only runs on little-endian hosts");
static_assert(sizeof(bool) == 1, "SizeCounter counts a bool in a vector as sizeof(bool)");

// Upper bound on any single string field (names, messages, paths). Part of the protocol.
inline constexpr uint32_t kMaxStringBytes = 4096;

class Writer {
 public:
  explicit Writer(std::vector<std::byte>& out) : out_(out) {}

  template <class T>
    requires(std::is_integral_v<T> || std::is_enum_v<T>)
  void operator()(const T& v) {
    append(&v, sizeof(T));
  }
  void operator()(const double& v) { append(&v, sizeof v); }
  void operator()(const bool& v) { uint8_t b = v ? 1 : 0; append(&b, 1); }
  void operator()(const std::string& s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    append(&n, 4);
    append(s.data(), s.size());
  }
  template <class T>
  void operator()(const std::vector<T>& vec) {
    uint32_t n = static_cast<uint32_t>(vec.size());
    append(&n, 4);
    for (const T& e : vec) (*this)(e);
  }
  template <class T>
    requires requires(T& t, Writer& w) { t.visit(w); }
  void operator()(const T& v) {
    const_cast<T&>(v).visit(*this);  // visit only reads fields when given a Writer
  }

 private:
  void append(const void* p, size_t n) {
    auto b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte>& out_;
};

// Counts the bytes a Writer appends for the same values, writing nothing: an encoding's size
// comes from the same visit() that encodes it, so a reply can be sized before it is built.
class SizeCounter {
 public:
  size_t bytes() const { return n_; }

  template <class T>
    requires(std::is_integral_v<T> || std::is_enum_v<T>)
  void operator()(const T&) {
    n_ += sizeof(T);
  }
  void operator()(const double&) { n_ += sizeof(double); }
  void operator()(const bool&) { n_ += 1; }
  void operator()(const std::string& s) { n_ += 4 + s.size(); }
  template <class T>
  void operator()(const std::vector<T>& vec) {
    n_ += 4;
    if constexpr (std::is_integral_v<T> || std::is_enum_v<T> || std::is_same_v<T, double>)
      n_ += sizeof(T) * vec.size();  // fixed width; a bool is one byte, as the Writer puts it
    else
      for (const T& e : vec) (*this)(e);
  }
  template <class T>
    requires requires(T& t, SizeCounter& c) { t.visit(c); }
  void operator()(const T& v) {
    const_cast<T&>(v).visit(*this);  // visit only reads fields when given a SizeCounter
  }

 private:
  size_t n_ = 0;
};

// Bytes the Writer appends for `v` (a message's payload, without the Header).
template <class T>
[[nodiscard]] size_t encoded_size(const T& v) {
  SizeCounter c;
  c(v);
  return c.bytes();
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
    if (!ok_ || n > kMaxStringBytes || n > remaining()) { ok_ = false; return; }
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
  }
  template <class T>
  void operator()(std::vector<T>& vec) {
    uint32_t n = 0;
    take(&n, 4);
    // Every element takes at least one byte, so a count above the bytes left is a lie:
    // refusing it here keeps a hostile count from reserving gigabytes.
    if (!ok_ || n > remaining()) { ok_ = false; return; }
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
    if (!ok_ || n > remaining()) { ok_ = false; std::memset(p, 0, n); return; }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace tier::wire
